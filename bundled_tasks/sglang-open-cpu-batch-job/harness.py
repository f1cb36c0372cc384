"""sglang-open-cpu-batch-job: an offline batch job on a CPU server; raise its output throughput.

Everything is in `infra_agent.serving.harness.ServingHarness`; this file names the deployment.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
