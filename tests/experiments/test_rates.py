"""Decisions that need more than a ratio of medians: constraints must be shown satisfied, rare
event rates are judged on pooled counts, and each factor says what it is (synthetic
measurements: every assertion here is deterministic)."""

from __future__ import annotations

import pytest

from infra_agent.experiments.measure import Measurement, decide, evidence
from infra_agent.feedback.bench import compare_samples
from infra_agent.judgement import rates
from infra_agent.store.verdict import Evidence, ExperimentResult, Verdict
from infra_agent.tasks.manifest import Constraint, Metric


def synthetic(base: list[float], cand: list[float], **extra: tuple[list[float], list[float]]):
    m = Measurement(compare_samples(base, cand, higher_is_better=False, paired=True))
    m.baseline = {"latency_ms": base, **{k: b for k, (b, _) in extra.items()}}
    m.candidate = {"latency_ms": cand, **{k: c for k, (_, c) in extra.items()}}
    return m


BASE = [10.0 + 0.1 * (i % 5) for i in range(20)]
FASTER = [b / 2 for b in BASE]


def test_a_constraint_passes_only_when_shown_satisfied(pytask) -> None:
    """pd-kv-reuse-race's reference fix once ran at 0.76-0.95x baseline throughput against a
    'within 5%' limit and passed: a constraint counted as broken only when its whole interval
    lay beyond the limit. Now it must be shown satisfied."""
    manifest = pytask().manifest
    manifest.constraints = [Constraint(metric="rps", max_ratio=1.05, higher_is_better=True)]
    noisy = [100.0 * (0.76 + 0.19 * (i % 5) / 4) for i in range(20)]  # 76-95 of baseline's 100
    within = [100.0 * (0.99 + 0.02 * (i % 3) / 2) for i in range(20)]
    base_rps = [100.0] * 20
    verdict, reasons, _, _ = decide(synthetic(BASE, FASTER, rps=(base_rps, noisy)), manifest)
    assert verdict == Verdict.REGRESSED, reasons  # the whole interval is beyond 1.05
    straddling = [100.0 * (0.90 + 0.15 * (i % 5) / 4) for i in range(20)]  # 90-105
    verdict, reasons, _, _ = decide(synthetic(BASE, FASTER, rps=(base_rps, straddling)), manifest)
    assert verdict == Verdict.NO_CHANGE, reasons
    assert any("constraint not shown satisfied: rps" in r for r in reasons), reasons
    verdict, reasons, _, _ = decide(synthetic(BASE, FASTER, rps=(base_rps, within)), manifest)
    assert verdict == Verdict.IMPROVED, reasons
    assert not any("constraint" in r for r in reasons), reasons


def rate_manifest(pytask, target: float | None = 3.0):
    manifest = pytask().manifest
    manifest.metric = Metric(
        name="corruptions_per_10k", unit="per 10k", higher_is_better=False,
        events="corruptions", trials="requests", target=target,
    )  # fmt: skip
    return manifest


def counts(events: list[int], trials: int) -> dict[str, list[float]]:
    return {
        "corruptions_per_10k": [1e4 * e / trials for e in events],
        "corruptions": [float(e) for e in events],
        "requests": [float(trials)] * len(events),
    }


def rate_measurement(base: list[int], cand: list[int], trials: int, manifest) -> Measurement:
    m = Measurement(compare_samples([1.0] * 3, [1.0] * 3, higher_is_better=False))
    m.baseline, m.candidate = counts(base, trials), counts(cand, trials)
    c = rates.pooled(m.baseline, m.candidate, "corruptions", "requests", 1e4)
    m.comparison = rates.as_comparison(c, len(base), manifest.min_effect)
    return m


def test_a_rare_race_fixed_is_shown_on_pooled_counts(pytask) -> None:
    """At the public case's rate (about 10 per 10k) most samples of 1,500 requests see one event
    or none: medians of per-sample bounds cannot tell a fix from the bug; pooled counts can."""
    manifest = rate_manifest(pytask)
    m = rate_measurement([2, 1, 3, 0, 2, 1, 2, 2], [0] * 8, 1500, manifest)
    verdict, reasons, _, _ = decide(m, manifest)
    assert verdict == Verdict.IMPROVED, reasons
    assert "13 of 12000 -> 0 of 12000" in reasons[0] and "below 2.5 per 10k" in reasons[0]
    perf = evidence(m, manifest)
    assert perf.gain == "rate ratio" and perf.ci_low > 1.0 and perf.ci_high == rates.UNBOUNDED


def test_a_rate_not_shown_below_the_target_is_not_improved(pytask) -> None:
    manifest = rate_manifest(pytask)
    m = rate_measurement([2, 1, 3, 0, 2, 1], [0, 1, 0, 0, 0, 0], 1500, manifest)  # 1 of 9000
    verdict, reasons, _, _ = decide(m, manifest)
    assert verdict == Verdict.NO_CHANGE and "not shown below the task's target" in reasons[0]
    m = rate_measurement([2, 1, 3, 0, 2, 1], [2, 2, 1, 3, 1, 0], 1500, manifest)
    assert decide(m, manifest)[0] == Verdict.NO_CHANGE
    m = rate_measurement([0, 1, 0, 0, 1, 0], [9, 12, 8, 10, 11, 9], 1500, manifest)
    assert decide(m, manifest)[0] == Verdict.REGRESSED


def test_exact_intervals() -> None:
    low, high = rates.clopper_pearson(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-6)
    low, high = rates.clopper_pearson(5, 10)
    assert low == pytest.approx(0.1871, abs=1e-4) and high == pytest.approx(0.8129, abs=1e-4)
    zero = rates.RateComparison(10, 10_000, 0, 10_000, 1e4)
    assert zero.candidate_upper == pytest.approx(2.996, abs=1e-3)  # zero of 10k: below 3 per 10k
    # kb = 10, kc = 0, equal trials: p_high = 1 - 0.025^(1/10), factor low = (1-p)/p
    p_high = 1 - 0.025 ** (1 / 10)
    assert zero.interval()[0] == pytest.approx((1 - p_high) / p_high, rel=1e-6)


def test_accuracy_tasks_report_an_error_ratio(pytask) -> None:
    manifest = pytask().manifest
    manifest.objective = "accuracy"
    manifest.plausible_speedup = 100.0
    m = synthetic(BASE, [b / 1000 for b in BASE])
    verdict, reasons, flags, _ = decide(m, manifest)
    assert any("error ratio 1000.00x is above the task's plausibility bound" in r for r in reasons)
    assert evidence(m, manifest).gain == "error ratio"
    shown = ExperimentResult(task="t", patch_id="p", verdict=verdict, reasons=reasons, flags=flags,
                             evidence=Evidence(performance=evidence(m, manifest))).render()  # fmt: skip
    assert (
        shown.startswith("IMPROVED [suspicious]: error ratio 1000.000x") and "speedup" not in shown
    )
