"""What an experiment can detect: the detectable-effect arithmetic checked against the real
decision rule by simulation, and the performance stage's calibration statement, its adaptive
sample count, and the `underpowered` NO_CHANGE (a fake harness, no sandboxes)."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest

from infra_agent.errors import UserError
from infra_agent.experiments import run_experiment
from infra_agent.experiments.arms import SeedSource
from infra_agent.experiments.measure import Measurement, decide, evidence, measure, wanted_effect
from infra_agent.feedback.bench import compare_samples
from infra_agent.judgement import power
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.harness import Arm, CheckResult, Harness
from infra_agent.tasks.manifest import TaskManifest


def test_detectable_effect_and_its_inverse() -> None:
    m = 0.05
    assert power.detectable_effect(0.0, m) == pytest.approx(1.05)
    effects = [power.detectable_effect(se, m) for se in (0.0, 0.01, 0.02, 0.05, 0.1)]
    assert effects == sorted(effects) and effects[-1] > 1.3
    for effect in (1.06, 1.10, 1.5):
        assert power.detectable_effect(power.se_for_effect(effect, m), m) == pytest.approx(effect)
    assert power.se_for_effect(1.05, m) == 0.0 and power.pairs_for(0.03, 0.0) is None
    # A relative width and the interval it describes give the same standard error.
    a = 0.07
    assert power.se_of_width(2 * math.sinh(a)) == pytest.approx(
        power.se_of_interval(1.2 / math.exp(a), 1.2 * math.exp(a))
    )
    # sglang-cpu-tiny asks for a 10% interval with a 5% minimum effect: it wants to see 10%.
    assert power.detectable_effect(power.se_of_width(0.10), m) == pytest.approx(1.10, abs=0.002)


def _simulated(effect: float, noise: float, pairs: int, rng: np.random.Generator) -> Measurement:
    """Throughput samples: a per-seed workload factor shared by both arms (cv 10%) and
    independent per-sample noise whose log per-pair ratio has sd `noise`."""
    work = rng.lognormal(0.0, 0.10, pairs)
    base = 100 * work * rng.lognormal(0.0, noise / math.sqrt(2), pairs)
    cand = 100 * effect * work * rng.lognormal(0.0, noise / math.sqrt(2), pairs)
    m = Measurement(compare_samples(list(base), list(cand), higher_is_better=True, paired=True))
    m.baseline, m.candidate = {"tput": list(base)}, {"tput": list(cand)}
    return m


def _manifest() -> TaskManifest:
    return TaskManifest.model_validate(
        {"name": "sim", "story": "s", "objective": "throughput", "editable": ["*.py"],
         "metric": {"name": "tput", "unit": "tok/s", "higher_is_better": True},
         "min_effect": 0.05}
    )  # fmt: skip


def test_the_detectable_effect_is_found_about_four_times_in_five() -> None:
    """The promise behind every 'detects X% or more': simulate experiments whose true effect is
    the predicted detectable effect and run the real decision on them."""
    manifest, rng = _manifest(), np.random.default_rng(7)
    noise, pairs = 0.05, 12
    effect = power.detectable_effect(power.Noise(noise, pairs, 1.0).se(pairs), manifest.min_effect)
    verdicts = [decide(_simulated(effect, noise, pairs, rng), manifest)[0] for _ in range(200)]
    rate = verdicts.count(Verdict.IMPROVED) / len(verdicts)
    assert 0.65 <= rate <= 0.95, (effect, rate)
    # ... and an A/A at the same noise is almost never a decision.
    aa = [decide(_simulated(1.0, noise, pairs, rng), manifest)[0] for _ in range(200)]
    assert aa.count(Verdict.NO_CHANGE) >= 196


class Noisy(Harness):
    """Samples `rate` per second with multiplicative noise; the candidate is `effect` faster."""

    effect = 1.0
    noise = 0.01

    def check(self, arm: Arm, seed: int) -> CheckResult:
        return CheckResult(passed=True)

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        rng = random.Random(seed * 2 + (arm.name == "candidate"))
        gain = self.effect if arm.name == "candidate" else 1.0
        return {"tput": 100.0 * gain * math.exp(rng.gauss(0.0, self.noise))}


class FixedSeeds(SeedSource):
    """Seeds from a seeded stream: these tests check what is said about a given noise, and four
    calibration pairs drawn at random see under half the true noise about 1 time in 10."""

    def __init__(self) -> None:
        super().__init__()
        self.rng = random.Random(0)

    def fresh(self) -> int:
        return self.rng.getrandbits(63)


def _run(
    effect: float, noise: float, *, detect: float | None = None, **budget: Any
) -> tuple[Measurement, list[str], TaskManifest]:
    manifest = _manifest()
    manifest.budget = manifest.budget.model_copy(update=budget)
    harness = Noisy(manifest, {})
    harness.effect, harness.noise = effect, noise
    arms = [Arm(name, sandbox=None, knobs={}, params={}) for name in ("baseline", "candidate")]  # type: ignore[arg-type]
    said: list[str] = []
    m = measure(harness, *arms, manifest, FixedSeeds(), deadline=math.inf, progress=said.append,
                detect=detect)  # fmt: skip
    return m, said, manifest


def test_quiet_measurement_states_what_it_sees_and_stops_early() -> None:
    m, said, manifest = _run(1.0, 0.01, min_samples=6, max_samples=40, target_ci_width=0.10)
    calibration = [line for line in said if line.startswith("calibration:")]
    assert len(calibration) == 1 and "per-pair noise" in calibration[0], said
    assert said.index(calibration[0]) < len(said) - 1  # stated before the rest of the samples
    assert m.comparison.n_baseline == 6  # the noise allowed it: stopped at the minimum
    verdict, reasons, flags, _ = decide(m, manifest)
    assert verdict is Verdict.NO_CHANGE and Flag.UNDERPOWERED not in flags
    assert any(r.startswith("resolution: this measurement detects changes of") for r in reasons)
    perf = evidence(m, manifest)
    assert perf.detectable_effect is not None and perf.detectable_effect < 1.10
    assert perf.pair_noise is not None and 0.002 < perf.pair_noise < 0.05
    assert perf.calibration == calibration[0] and perf.wanted_effect == pytest.approx(
        1.10, abs=0.002
    )


def test_noisier_measurement_takes_more_samples() -> None:
    quiet, _, _ = _run(1.0, 0.01, min_samples=6, max_samples=40)
    noisy, _, _ = _run(1.0, 0.06, min_samples=6, max_samples=40)
    assert noisy.comparison.n_baseline > quiet.comparison.n_baseline


def test_a_finer_request_than_the_budget_allows_is_said_not_silent() -> None:
    m, said, manifest = _run(1.0, 0.05, detect=0.06, min_samples=6, max_samples=8)
    calibration = next(line for line in said if line.startswith("calibration:"))
    assert "finer than this budget allows" in calibration and "samples/arm" in calibration
    verdict, reasons, flags, _ = decide(m, manifest)
    assert verdict is Verdict.NO_CHANGE and Flag.UNDERPOWERED in flags
    assert reasons[1].startswith("underpowered: NO_CHANGE only rules out changes of"), reasons
    assert "6.0% was asked for" in reasons[1] and "raise the budget's max_samples" in reasons[1]
    # A large effect is still seen at the same budget, and then nothing is flagged.
    m, _, manifest = _run(1.5, 0.05, detect=0.06, min_samples=6, max_samples=8)
    verdict, reasons, flags, _ = decide(m, manifest)
    assert verdict is Verdict.IMPROVED and Flag.UNDERPOWERED not in flags


def test_wanted_effect_and_bad_detect(pytask, make_patch) -> None:
    manifest = _manifest()
    assert wanted_effect(manifest, 0.03) == pytest.approx(1.03)
    assert wanted_effect(manifest) == pytest.approx(
        power.detectable_effect(power.se_of_width(manifest.budget.target_ci_width), 0.05)
    )
    task = pytask()
    patch = make_patch(task, "kernel.py", (task.workspace / "kernel.py").read_text() + "\n")
    for bad in (0.0, -0.1, 10.0):
        with pytest.raises(UserError, match="detect must be a relative change"):
            run_experiment(task, patch, detect=bad)
    with pytest.raises(UserError, match="not above the task's min_effect 0.05"):
        run_experiment(task, patch, detect=0.05)


def test_cli_refuses_a_detect_below_the_minimum_effect(pytask, make_patch, tmp_path) -> None:
    import subprocess
    import sys

    task = pytask()
    patch = tmp_path / "p.diff"
    patch.write_text(
        make_patch(task, "kernel.py", (task.workspace / "kernel.py").read_text() + "\n").diff
    )
    argv = [sys.executable, "-m", "infra_agent.cli", "--db", str(tmp_path / "runs.db"),
            "experiment", "--task", str(task.root), "--patch", str(patch), "--detect", "0.01"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not above the task's min_effect" in done.stderr, done.stderr
