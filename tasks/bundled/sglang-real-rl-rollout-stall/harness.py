"""sglang-real-rl-rollout-stall: streamed rollouts that ask for log-probabilities slow down.

The serving harness with the rollout client's request shape: every request streams and asks for
the log-probability of each output token, its top-N alternatives and their text (params
`top_logprobs_num`, `return_text_in_logprobs`), as RL rollout and evaluation clients do.
"""

from pathlib import Path

from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.workload import LoadSpec


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
