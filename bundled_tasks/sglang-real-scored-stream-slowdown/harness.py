"""sglang-real-scored-stream-slowdown: a streamed scoring job that asks for log-probabilities.

The serving harness with the scoring client's request shape: every request streams from the
native endpoint (cumulative chunks) and asks for the log-probability of each output token and of
its top-N alternatives (params `top_logprobs_num`, `return_text_in_logprobs`), as scoring and
distillation clients do.
"""

from pathlib import Path
from typing import Any

from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.load.generator import LoadSpec
from infra_agent.tasks.workload import Workload


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"

    def load(self, seed: int) -> LoadSpec:
        p = self.params
        asks = {
            "return_logprob": True,
            "top_logprobs_num": int(p["top_logprobs_num"]),
            "return_text_in_logprobs": bool(p["return_text_in_logprobs"]),
        }
        return super().load(seed).model_copy(update=asks)

    def workload(self, knobs: dict[str, Any]) -> Workload:
        asked = super().workload(knobs)
        top = self.params["top_logprobs_num"]
        extra = f"; every request asks for the logprob of each output token and its top {top}"
        return asked.model_copy(update={"summary": asked.summary + extra})
