"""sglang-stalled-scheduler: a real SGLang server that serves slowly while both cores are busy.

Everything is in `infra_agent.serving.harness.ServingHarness`; this file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
