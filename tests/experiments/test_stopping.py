"""The stopping rule where a speedup's power plan meets constraints and rate metrics: sampling
goes on until every constraint is shown either way, a rate metric has no calibration or
`detect`, and a constraint's outcome does not make a resolved metric look underpowered
(a deterministic fake harness, no sandboxes)."""

from __future__ import annotations

import math
import random

import pytest
from pydantic import ValidationError

from infra_agent.errors import UserError
from infra_agent.experiments import run_experiment
from infra_agent.experiments.arms import SeedSource
from infra_agent.experiments.measure import Measurement, decide, evidence, measure
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.harness import Arm, CheckResult, Harness
from infra_agent.tasks.manifest import Constraint, Metric, TaskManifest


class Fake(Harness):
    """tput 100 (candidate x `effect`) with 1% noise; the candidate's rps at `rps_ratio` of
    baseline's, times `1 +- rps_swing` in turn (a constraint no sample count shows within a
    limit narrower than the swing); corruption counts at `rates`."""

    effect, rps_ratio, rps_swing, rates = 1.0, 1.0, 0.3, (0.001, 0.0)
    taken = 0
    slow: int | None = None
    """The candidate's sample of this number (1: its first) runs at 0.8x the baseline."""

    def check(self, arm: Arm, seed: int) -> CheckResult:
        return CheckResult(passed=True)

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        cand = arm.name == "candidate"
        rng = random.Random(seed * 2 + cand)
        self.taken += cand
        swing = 1.0 + (self.rps_swing if self.taken % 2 else -self.rps_swing) if cand else 1.0
        events = sum(rng.random() < self.rates[cand] for _ in range(2000))
        return {
            "tput": 100.0
            * ((0.8 if self.taken == self.slow else self.effect) if cand else 1.0)
            * math.exp(rng.gauss(0.0, 0.01)),
            "rps": 50.0 * (self.rps_ratio if cand else 1.0) * swing,
            "corruptions": float(events),
            "requests": 2000.0,
            "per_10k": 1e4 * events / 2000,
        }


def _manifest(**metric: object) -> TaskManifest:
    return TaskManifest.model_validate(
        {"name": "sim", "story": "s", "objective": "throughput", "editable": ["*.py"],
         "metric": {"name": "tput", "unit": "tok/s", "higher_is_better": True, **metric},
         "min_effect": 0.05,
         "budget": {"min_samples": 6, "max_samples": 30, "target_ci_width": 0.10}}
    )  # fmt: skip


def _measure(manifest: TaskManifest, **attrs: object) -> tuple[Measurement, list[str]]:
    harness = Fake(manifest, {})
    for name, value in attrs.items():
        setattr(harness, name, value)
    arms = [Arm(name, sandbox=None, knobs={}, params={}) for name in ("baseline", "candidate")]  # type: ignore[arg-type]
    said: list[str] = []
    m = measure(harness, *arms, manifest, SeedSource(), deadline=math.inf, progress=said.append)
    return m, said


def test_an_open_constraint_keeps_sampling_past_the_power_goal() -> None:
    manifest = _manifest()
    quiet, _ = _measure(manifest, effect=1.3)
    assert quiet.comparison.n_baseline == 6  # the speedup alone is resolved at the minimum
    manifest.constraints = [Constraint(metric="rps", max_ratio=1.05, higher_is_better=True)]
    m, said = _measure(manifest, effect=1.3)  # rps unchanged, too noisy to show within 5%
    assert m.comparison.n_baseline == 30, said  # sampled on to the budget's end
    verdict, reasons, flags, _ = decide(m, manifest)
    assert verdict is Verdict.NO_CHANGE, reasons
    assert any("constraint not shown satisfied: rps" in r for r in reasons), reasons
    # the speedup itself was resolved: no underpowered flag for a constraint's outcome
    assert Flag.UNDERPOWERED not in flags and reasons[1].startswith("resolution:"), reasons
    m, said = _measure(manifest, effect=1.3, rps_ratio=0.5, rps_swing=0.01)  # shown broken
    assert m.comparison.n_baseline == 6, said
    verdict, reasons, _, _ = decide(m, manifest)
    assert verdict is Verdict.REGRESSED and "constraint broken: rps" in reasons[-1], reasons


def test_sampling_goes_on_while_the_sign_test_would_overrule_the_interval() -> None:
    """Measured: a 1.134x (95% CI 1.097-1.210) stopped at 8 pairs, resolved, and came out
    NO_CHANGE because one pair of 8 went the other way (with 8 pairs the sign test's interval is
    the smallest and largest ratio). Now it samples on until the two agree."""
    manifest = _manifest()
    m, said = _measure(manifest, effect=1.3, slow=2)  # one pair of the first six at 0.8x
    assert m.comparison.n_baseline > 6, said  # resolved at 6 by the interval alone
    verdict, reasons, _, _ = decide(m, manifest)
    assert verdict is Verdict.IMPROVED, reasons
    m, said = _measure(manifest, effect=1.3)
    assert m.comparison.n_baseline == 6, said


def test_a_rate_metric_has_no_calibration_and_no_pair_noise() -> None:
    manifest = _manifest(name="per_10k", unit="per 10k", higher_is_better=False,
                         events="corruptions", trials="requests", target=None)  # fmt: skip
    manifest.budget = manifest.budget.model_copy(update={"max_samples": 60})
    m, said = _measure(manifest, rates=(0.004, 0.0))
    assert not any(line.startswith("calibration:") for line in said), said
    assert m.plan is None and not math.isfinite(m.wanted)
    verdict, reasons, flags, _ = decide(m, manifest)
    assert verdict is Verdict.IMPROVED, reasons
    assert Flag.UNDERPOWERED not in flags and not any("resolution:" in r for r in reasons)
    perf = evidence(m, manifest)
    assert perf.gain == "rate ratio" and perf.pair_noise is None and perf.detectable_effect is None


def test_detect_and_companion_do_not_apply_to_a_rate_metric(pytask, make_patch) -> None:
    with pytest.raises(ValidationError, match="takes no companion"):
        Metric(name="r", unit="per 10k", higher_is_better=False, events="e", trials="t",
               companion="c")  # fmt: skip
    task = pytask()
    task.manifest.metric = Metric(
        name="r", unit="per 10k", higher_is_better=False, events="e", trials="t"
    )
    patch = make_patch(task, "kernel.py", (task.workspace / "kernel.py").read_text() + "\n")
    with pytest.raises(UserError, match="detect applies to a speedup"):
        run_experiment(task, patch, detect=0.2)
