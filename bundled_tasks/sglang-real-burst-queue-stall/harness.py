"""sglang-real-burst-queue-stall: a burst of short requests stalls a longest-prefix-first server.

Everything is in `infra_agent.serving.harness.ServingHarness`; this file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
