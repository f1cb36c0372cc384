"""sglang-real-banned-tokens-slowdown: short answers with a ban list crawl under bursts.

The serving harness with the moderation client's request shape: every request carries the same
logit_bias, -100 on a fixed list of `banned_tokens` token ids (drawn once with `ban_seed` from
the vocabulary past the special tokens).
"""

import random
from pathlib import Path
from typing import Any

from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.load.generator import LoadSpec
from infra_agent.tasks.workload import Workload

SPECIAL_TOKENS = 3
"""The tiny vocabulary's <unk>, <s>, </s> (ids 0-2): never banned."""


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"

    def ban_list(self) -> dict[str, float]:
        p = self.params
        ids = random.Random(int(p["ban_seed"])).sample(
            range(SPECIAL_TOKENS, self.vocab), int(p["banned_tokens"])
        )
        return {str(token): -100.0 for token in sorted(ids)}

    def load(self, seed: int) -> LoadSpec:
        return super().load(seed).model_copy(update={"logit_bias": self.ban_list()})

    def workload(self, knobs: dict[str, Any]) -> Workload:
        asked = super().workload(knobs)
        extra = (
            f"; every request bans the same {self.params['banned_tokens']} token ids "
            "(logit_bias -100 each)"
        )
        return asked.model_copy(update={"summary": asked.summary + extra})
