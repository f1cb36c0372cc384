"""sglang-real-label-burst-slowdown: bursts of one-token labelling requests crawl.

Everything is in `infra_agent.serving.harness.ServingHarness`; this file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
