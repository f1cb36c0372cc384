"""The harness of serving accuracy tasks: returned log-probabilities against the un-injected engine.

    class TaskHarness(LogprobHarness):
        deployment_path = Path(__file__).parent / "deployment.toml"

sample(arm, seed): answers with top-k log-probs to a fresh prompt set (the gate's shape), sampled
    at temperature 1 with per-prompt seeds (SGLang's seeded sampling picks the same tokens from
    the same logits), and the same prompts answered by the reference engine
    (`serving.harness.reference`: the installed SGLang without the task's fault or any patch);
    the metric `logprob_err` is the mean absolute
    difference of the log-probabilities of the tokens both top-k lists hold, at every position up
    to and including the first token where the answers part (after it the contexts differ).
    Values below `FLOOR_NATS` count as the floor: an engine that matches the reference to the
    last bit is not infinitely better than one off by 1e-6 nats.
check, health: as `ServingHarness` (the gate against the baseline, the output health guard).
diagnose(arm): the distance over a few prompt sets, the reference's own spread (the same
    prompts in another batch order), and where precision is lost:
    `serving.instruments.precision` profiles the arm's scheduler with torch.profiler and names the SGLang function that runs
    reduced-precision math on the sampling path.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from infra_agent.serving.harness.accuracy import Answer, answer, gate_prompts
from infra_agent.serving.harness.base import ServingHarness
from infra_agent.serving.harness.reference import ReferenceEngine
from infra_agent.tasks.harness import Arm
from infra_agent.tasks.manifest import TaskManifest

FLOOR_NATS = 1e-4


@dataclass
class Distance:
    mean_nats: float
    max_nats: float
    pairs: int
    """(position, token) pairs compared."""


def logprob_distance(mine: list[Answer], reference: list[Answer]) -> Distance:
    """Distance between two answer sets (see the module docstring)."""
    diffs: list[float] = []
    for a, b in zip(mine, reference, strict=True):
        for i, (ta, tb) in enumerate(zip(a.top, b.top, strict=False)):
            diffs.extend(abs(ta[t] - tb[t]) for t in set(ta) & set(tb))
            if a.ids[i] != b.ids[i]:
                break
    if not diffs:
        return Distance(mean_nats=float("inf"), max_nats=float("inf"), pairs=0)
    return Distance(mean_nats=statistics.fmean(diffs), max_nats=max(diffs), pairs=len(diffs))


class LogprobHarness(ServingHarness):
    def __init__(self, manifest: TaskManifest, params: dict[str, Any]) -> None:
        super().__init__(manifest, params)
        self.reference = ReferenceEngine(self.deployment)
        self._finished: set[str] = set()

    def distance(self, arm: Arm, seed: int) -> Distance:
        prompts = gate_prompts(self.gate, vocab_size=self.vocab, seed=seed)
        seed %= 2**31
        mine = self.server(arm).call(answer, prompts, self.gate, sampling_seed=seed)
        return logprob_distance(
            mine, self.reference.answers(prompts, self.gate, seed, sampled=True)
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        found = self.distance(arm, seed)
        return {
            "logprob_err": max(found.mean_nats, FLOOR_NATS),
            "logprob_err_max": found.max_nats,
        }

    def finish(self, arm: Arm) -> None:
        try:
            super().finish(arm)
        finally:
            self._finished.add(arm.name)
            if self._finished >= set(self.arms):
                self.reference.stop()

    def reference_spread(self, seed: int) -> Distance:
        """The reference engine against itself: the same prompts one at a time instead of in one
        batch (what batching alone changes)."""
        prompts = gate_prompts(self.gate, vocab_size=self.vocab, seed=seed)
        seed %= 2**31
        first = self.reference.answers(prompts, self.gate, seed, sampled=True)
        # Reversed order, each prompt with its own seed as before.
        again = [
            self.reference.server().call(answer, [prompt], self.gate, sampling_seed=seed + i)[0]
            for i, prompt in enumerate(prompts)
        ]
        return logprob_distance(again, first)

    def diagnose(self, arm: Arm) -> Any:
        from infra_agent.serving.instruments.precision import audit_sampling_precision
        from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Diagnosis

        seeds = [DIAGNOSE_SEED + i for i in range(3)]
        found = [self.distance(arm, s) for s in seeds]
        spread = [self.reference_spread(s) for s in seeds]
        err = statistics.fmean(d.mean_nats for d in found)
        noise = statistics.fmean(d.mean_nats for d in spread)
        ratio = err / noise if noise > 0 else float("inf")
        audit = audit_sampling_precision(self, arm)
        return Diagnosis(
            reproduced=err > 10 * max(noise, FLOOR_NATS / 10),
            symptom=f"returned log-probabilities differ from the reference engine's by "
            f"{err:.2e} nats on average (max {max(d.max_nats for d in found):.2e}); the "
            f"reference against itself in another batch order: {noise:.2e} ({ratio:.3g}x)",
            measured={
                "logprob_err_nats": err,
                "reference_spread_nats": noise,
                "ratio_to_spread": ratio,
                **audit.measured,
            },
            localization=audit.localization,
            evidence=[
                *(
                    f"prompt set {i}: {d.mean_nats:.2e} nats mean, {d.max_nats:.2e} max over "
                    f"{d.pairs} (position, token) pairs; reference spread {s.mean_nats:.2e}"
                    for i, (d, s) in enumerate(zip(found, spread, strict=True))
                ),
                *audit.evidence,
            ],
            instruments=["reference engine distance", *audit.instruments],
        )
