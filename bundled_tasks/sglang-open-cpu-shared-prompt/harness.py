"""sglang-open-cpu-shared-prompt: a triage service on a CPU server, every request the same long
instructions and a short message; raise its output throughput.

The harness is `infra_agent.serving.harness.ServingHarness`; this file names the deployment and
the requests: each is the service's instructions (`instructions_len` tokens, the same in every
request of every run, so the server's prefix cache holds them after the warm-up) followed by
one message (`input_len` tokens at most, half that at least) and asks for `output_len` tokens at
most (half that at least).
"""

from pathlib import Path
from typing import Any

from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.load.datasets import Session, Turn, random_sessions
from infra_agent.tasks.workload import Workload

INSTRUCTIONS_SEED = 0
"""The instructions are one fixed draw: the service sends the same ones with every request."""


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"

    def sessions(self, prompts: int, *, seed: int) -> list[Session]:
        p = self.params
        (instructions,) = random_sessions(
            1, int(p["instructions_len"]), 1, vocab_size=self.vocab, range_ratio=0.0,
            seed=INSTRUCTIONS_SEED,
        )  # fmt: skip
        messages = random_sessions(
            prompts, int(p["input_len"]), int(p["output_len"]), vocab_size=self.vocab, seed=seed
        )
        head = instructions.turns[0].new_ids
        return [
            Session(
                turns=[Turn(new_ids=head + m.turns[0].new_ids, output_len=m.turns[0].output_len)]
            )
            for m in messages
        ]

    def workload(self, knobs: dict[str, Any]) -> Workload:
        workload = super().workload(knobs)
        head = f"the same {self.params['instructions_len']} tokens of instructions, then "
        return workload.model_copy(update={"summary": head + workload.summary})
