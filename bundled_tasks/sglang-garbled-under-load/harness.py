"""sglang-garbled-under-load: outputs under load against the same tokens scored alone.

Everything is in `infra_agent.serving.harness.corruption.LoadCorruptionHarness`; this file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness.corruption import LoadCorruptionHarness


class TaskHarness(LoadCorruptionHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
