"""sglang-gpu-example: the serving harness on an 8-GPU deployment (see README.md).

The same `ServingHarness` as sglang-cpu-tiny; `prepare` stops with the reason on a machine
without the GPUs the deployment asks for.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"
