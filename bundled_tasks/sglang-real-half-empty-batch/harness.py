"""sglang-real-half-empty-batch: a burst of chat requests with mixed answer lengths waits long
for its first tokens on a server capped at a few running requests.

The serving harness with the burst's shape: prompts as usual (uniform in [input_len / 2,
input_len]), answer lengths spread wider, uniform in [output_len * (1 - answer_spread),
output_len] (short and long answers in the same job), drawn with their own seeded generator.
"""

import random
from pathlib import Path
from typing import Any

from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.load.datasets import Session
from infra_agent.tasks.workload import Workload


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"

    def sessions(self, prompts: int, *, seed: int) -> list[Session]:
        sessions = super().sessions(prompts, seed=seed)
        longest = int(self.params["output_len"])
        shortest = max(1, int(longest * (1 - float(self.params["answer_spread"]))))
        rng = random.Random(seed ^ 0xA45)
        for session in sessions:
            for turn in session.turns:
                turn.output_len = rng.randint(shortest, longest)
        return sessions

    def workload(self, knobs: dict[str, Any]) -> Workload:
        asked = super().workload(knobs)
        longest = int(self.params["output_len"])
        shortest = max(1, int(longest * (1 - float(self.params["answer_spread"]))))
        extra = f"; answer lengths uniform in [{shortest}, {longest}] tokens"
        return asked.model_copy(update={"summary": asked.summary + extra})
