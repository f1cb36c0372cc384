"""sglang-real-late-first-token: streamed chat answers start late.

Everything is in `infra_agent.serving.harness.ServingHarness`; this file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
