"""One honest verdict text (issue 34 item 5): the samples of a real sglang-cpu-tiny experiment
(tests/experiments/data) replayed through the measurement and the verdict rule, rendered: each
number once, one interval, the final noise and resolution (not the calibration's), what the
correctness check compared, health in one line when clean and the tripped rules when not. No
server: the serving check runs on a stand-in for its servers."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from typing import Any

import pytest
from recorded_samples import Replay, aa_pairs, arms

from infra_agent.experiments.arms import SeedSource, effective_params
from infra_agent.experiments.cascade import Experiment, _correctness, _Stop
from infra_agent.experiments.measure import Measurement, decide, evidence, measure
from infra_agent.experiments.verdict_text import verdict_text
from infra_agent.feedback.health import HealthReport, compare_health
from infra_agent.serving.harness.accuracy import compare_likelihood
from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import (
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    StopReason,
    Verdict,
)
from infra_agent.tasks.harness import Arm
from infra_agent.tasks.manifest import TaskManifest
from infra_agent.tasks.registry import find_task


@pytest.fixture
def manifest() -> TaskManifest:
    """sglang-cpu-tiny with a 12-pair budget: the recorded noise of a loaded machine cannot
    resolve the task's precision in 12 pairs."""
    m = find_task("sglang-cpu-tiny").manifest
    return m.model_copy(update={"budget": m.budget.model_copy(update={"max_samples": 12})})


def _underpowered(manifest: TaskManifest) -> tuple[Measurement, ExperimentResult]:
    """The recorded baseline's time-adjacent samples as an A/A experiment: NO_CHANGE, underpowered."""
    m = measure(Replay(manifest, aa_pairs()), *arms(), manifest, SeedSource(), deadline=math.inf)
    verdict, reasons, flags, metrics = decide(m, manifest)
    result = ExperimentResult(
        task=manifest.name, patch_id="p" * 64, verdict=verdict, reasons=reasons, flags=flags,
        evidence=Evidence(performance=evidence(m, manifest), metrics=metrics),
    )  # fmt: skip
    return m, result


def test_each_number_once_and_the_final_noise_not_the_calibration(manifest: TaskManifest) -> None:
    m, result = _underpowered(manifest)
    perf = result.evidence.performance
    assert perf is not None and m.plan is not None
    assert result.verdict is Verdict.NO_CHANGE and Flag.UNDERPOWERED in result.flags, result.reasons
    assert perf.stopped is StopReason.MAX_SAMPLES and perf.n_samples == 12
    record = ExperimentRecord(task=manifest.name, patch_id=result.patch_id, result=result)
    text = verdict_text(record, manifest)  # what the model reads
    numbers = Counter(re.findall(r"\d+\.\d+%?", text))
    assert [n for n, k in numbers.items() if k > 1] == [], text
    assert "task criteria:\n- constraint ttft_p99_ms" in text and "extendable: extend=" in text
    # one interval, first, with the gain, the pairs and the medians
    assert text.count("95% CI") == 1 and text.count("n=12/arm") == 1
    assert text.splitlines()[0].startswith(
        f"experiment {record.id} on patch pppppppppppp: NO_CHANGE [noisy, underpowered]: speedup {perf.speedup:.3f}x "
        f"(95% CI {perf.ci_low:.3f}-{perf.ci_high:.3f}, n=12/arm; sampling stopped at the "
        "budget's max_samples); output_throughput median"
    ), text
    # one noise figure and one resolution: the final ones, over all 12 pairs
    assert perf.pair_noise is not None and perf.detectable_effect is not None
    assert text.count("per-pair noise") == 1 and f"per-pair noise {perf.pair_noise:.1%}" in text
    assert (
        text.count("detects") == 0 and text.count(f"{perf.detectable_effect - 1:.1%} or more") == 1
    )
    calibrated = m.plan.noise.pair_sd
    assert f"{calibrated:.1%}" != f"{perf.pair_noise:.1%}"  # the 4-pair calibration differs...
    assert f"{calibrated:.1%}" not in text and "calibration" not in text  # ...and is not said
    assert perf.calibration.startswith("calibration: per-pair noise")  # but kept in the record
    assert perf.pairs_needed is not None and f"about {perf.pairs_needed} samples/arm" in text


def test_the_serving_check_says_what_it_compared(manifest: TaskManifest) -> None:
    """ServingHarness.check on a stand-in for its servers: the likelihood judgement of the
    workload's own outputs under the baseline server is named, and no 'max abs err' is made up
    from it."""
    from infra_agent.serving.harness import ServingHarness

    class StandIn(ServingHarness):
        deployment_path = find_task("sglang-cpu-tiny").root / "deployment.toml"

        def measured(self, arm: Arm, seed: int) -> Any:
            arm.state.setdefault("runs", {})[seed] = []

        def judge(self, seeds: list[int], limit: int, rng: random.Random) -> Any:
            noise = random.Random(7)
            base = [-5.85 + noise.gauss(0, 0.27) for _ in range(32)]
            return compare_likelihood(base, [b + noise.gauss(0, 0.05) for b in base])

    harness = StandIn(manifest, effective_params(manifest, None))
    base, cand = arms()
    harness.arms = {"baseline": base, "candidate": cand}
    checks = {"baseline": [harness.check(base, 11)], "candidate": [harness.check(cand, 11)]}
    corr = _correctness(checks, passed=True)
    line = ExperimentResult(task="t", patch_id="p", verdict=Verdict.NO_CHANGE, reasons=[],
                            evidence=Evidence(correctness=corr)).render().splitlines()[-1]  # fmt: skip
    assert line.startswith("correctness pass on 1 fresh input: the token ids each server returned"), line  # fmt: skip
    assert "log-prob under the baseline server" in line and "signed-rank test" in line, line
    assert "max abs err" not in line


def _health(outputs: int, loops: int) -> dict[str, float | int | str | bool]:
    per_rule = {"repetition_loop": loops} if loops else {}
    return HealthReport(outputs=outputs, unhealthy=loops, per_rule=per_rule).as_health()


class Guarded(Replay):
    """Health as a serving harness reports it: output counts per rule, compared by the guard."""

    loops = 0

    def health(self, arm: Arm, seed: int) -> dict[str, float | int | str | bool]:
        return _health(256, self.loops if arm.name == "candidate" else 0)

    def health_problems(self, baseline: dict[str, Any], candidate: dict[str, Any]) -> list[str]:
        return compare_health(baseline, candidate)


@pytest.mark.parametrize("loops", [0, 40])
def test_health_is_one_line_when_clean_and_names_the_rule_when_not(pytask, make_patch, loops: int) -> None:  # fmt: skip
    task = pytask()
    patch = make_patch(task, "kernel.py", (task.workspace / "kernel.py").read_text() + "\n")
    run = Experiment(task, patch, backend="local", params={}, progress=None, bootstrap_seed=0)
    harness = Guarded(task.manifest, {})
    harness.loops = loops
    verdict = Verdict.NO_CHANGE
    try:
        run.health(harness, *arms())
    except _Stop as stop:
        verdict, run.reasons = stop.verdict, stop.reasons
    text = ExperimentResult(task=task.name, patch_id=patch.hash, verdict=verdict,
                            reasons=run.reasons, flags=run.flags, evidence=run.evidence).render()  # fmt: skip
    health = [line for line in text.splitlines()[1:] if "health" in line]
    if not loops:
        assert health == ["health: clean: 0/256 candidate outputs unhealthy (baseline 0/256)"], text
        assert len(run.evidence.health) == 14  # the record keeps every value
    else:
        assert verdict is Verdict.INCORRECT and Flag.HEALTH_WARNING in run.flags
        assert "health: clean" not in text
        assert health == [
            "- health check: health rule repetition_loop: candidate tripped it in 40/256 "
            "outputs vs baseline 0/256"
        ], text


def test_an_interval_the_sign_test_overruled_says_so_in_the_headline() -> None:
    """Eight pairs, seven of them 2x faster and one slower: the bootstrap interval of medians
    lies above 1, the sign test's interval of per-pair ratios does not, so NO_CHANGE. The
    headline's interval, which alone would read as a win, is labelled as overruled."""
    from infra_agent.judgement.bootstrap import compare_samples
    from infra_agent.judgement.decision import Rule
    from infra_agent.judgement.decision import decide as judge

    baseline = [10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3, 10.0]
    candidate = [5.0, 5.1, 4.9, 5.2, 5.0, 5.1, 4.8, 11.0]
    comparison = compare_samples(baseline, candidate, higher_is_better=False, paired=True)
    ratios = [b / c for b, c in zip(baseline, candidate, strict=True)]
    decision = judge(comparison, Rule(min_effect=0.05), ratios)
    assert decision.verdict == Verdict.NO_CHANGE and comparison.ci_low > 1.05, decision
    perf = PerformanceEvidence(
        metric="latency_ms", unit="ms", higher_is_better=False, n_samples=8,
        baseline_median=10.0, candidate_median=5.05, speedup=comparison.speedup,
        ci_low=comparison.ci_low, ci_high=comparison.ci_high,
    )  # fmt: skip
    result = ExperimentResult(
        task="t", patch_id="p", verdict=decision.verdict, reasons=decision.reasons,
        evidence=Evidence(performance=perf),
    )  # fmt: skip
    head, reason = result.render().splitlines()[:2]
    assert "(bootstrap 95% CI" in head and "overruled by the sign test below" in head, head
    assert reason.startswith("- not shown: the sign test's 95% interval"), reason
    assert "includes 1.0: 7 of 8 pairs were better, too few at this count" in reason, reason
    clean = result.model_copy(update={"verdict": Verdict.IMPROVED, "reasons": ["better"]})
    assert "overruled" not in clean.render().splitlines()[0]


def test_a_gain_that_differs_from_the_medians_ratio_says_what_it_is() -> None:
    """A relay run read 'speedup 1.424x' beside 'median 1156 -> 1271 tok/s' (1.099x) as a
    contradiction: the gain is the median of the per-pair ratios, and the headline says so when
    the two differ by more than 2%; an unpaired gain (the medians' ratio) adds nothing."""
    from infra_agent.store.verdict import PerformanceEvidence, _headline

    def perf(speedup: float, method: str) -> PerformanceEvidence:
        return PerformanceEvidence(
            metric="output_throughput", unit="tok/s", higher_is_better=True,
            baseline_median=1156.0, candidate_median=1271.0, speedup=speedup, ci_low=0.83,
            ci_high=1.86, n_samples=8, method=method,
        )  # fmt: skip

    paired = "bootstrap of the median of per-pair ratios (paired, 2000 resamples)"
    text = _headline(perf(1.424, paired))
    assert text.endswith(
        "median 1156 -> 1271 tok/s (their ratio 1.099x; the gain is the median of the per-pair "
        "ratios, each pair measured back to back)"
    ), text
    assert "their ratio" not in _headline(perf(1.10, paired))  # within 2%: nothing to explain
    assert "their ratio" not in _headline(perf(1.424, "ratio of medians (unpaired"))
