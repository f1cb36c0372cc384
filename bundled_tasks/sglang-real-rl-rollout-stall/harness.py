"""sglang-real-rl-rollout-stall: streamed rollouts that ask for log-probabilities slow down.

The serving harness with the rollout client's request shape: every request streams and asks for
the log-probability of each output token, its top-N alternatives and their text (params
`top_logprobs_num`, `return_text_in_logprobs`), as RL rollout and evaluation clients do.
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
            "incremental": bool(
                self.deployment.server_args.get("incremental-streaming-output", False)
            ),
        }
        return super().load(seed).model_copy(update=asks)

    def workload(self, knobs: dict[str, Any]) -> Workload:
        asked = super().workload(knobs)
        p = self.params
        extra = (
            f"; every request asks for the logprob of each output token, its top "
            f"{p['top_logprobs_num']} alternatives"
            + (" and their text" if p["return_text_in_logprobs"] else "")
        )
        return asked.model_copy(update={"summary": asked.summary + extra})
