"""sglang-real-batch-request-slowdown: a batch job that sends its prompts as lists crawls.

The serving harness with the batch client's request shape: every request to the native endpoint
carries `batch_size` token-id prompts as one list (param `batch_size`), streamed; each prompt is
still its own record.
"""

from pathlib import Path
from typing import Any

from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.load.generator import LoadSpec
from infra_agent.tasks.workload import Workload


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"

    def load(self, seed: int) -> LoadSpec:
        return super().load(seed).model_copy(update={"batch_size": int(self.params["batch_size"])})

    def workload(self, knobs: dict[str, Any]) -> Workload:
        asked = super().workload(knobs)
        extra = f"; the prompts go {self.params['batch_size']} to a request, as one list"
        return asked.model_copy(update={"summary": asked.summary + extra})
