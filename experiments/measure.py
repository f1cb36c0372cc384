"""The performance stage: interleaved samples of both arms, adaptive stopping, and the decision.

Samples come in rounds of four in ABBA / BAAB order on two fresh seeds, so each arm runs each
input once and slow drift of the machine hits both arms alike. Pairs (same seed) feed a paired
bootstrap of the ratio of medians (`feedback.bench.compare_samples`). Sampling stops once the 95%
interval of the speedup is narrower than `target_ci_width` (relative; for a rate metric: once the
difference is shown either way) and every constraint is shown satisfied or broken, with at least
`min_samples` per arm; or at `max_samples`, or when `measure_budget_s` is spent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from infra_agent.experiments import rates
from infra_agent.experiments.arms import SeedSource
from infra_agent.feedback.bench import Comparison, compare_samples
from infra_agent.store.verdict import Flag, PerformanceEvidence, Verdict
from infra_agent.tasks.harness import Arm, Harness
from infra_agent.tasks.manifest import Constraint, TaskManifest


class ArmError(Exception):
    """A failure raised while running one arm (wraps the harness's exception)."""

    def __init__(self, arm: str, error: BaseException) -> None:
        super().__init__(f"{arm}: {error}")
        self.arm = arm
        self.error = error


class ExperimentTimeout(Exception):
    """The whole experiment ran past `budget.experiment_timeout_s`."""


@dataclass
class Measurement:
    comparison: Comparison
    baseline: dict[str, list[float]] = field(default_factory=dict)
    """Metric name -> samples, in measurement order."""
    candidate: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0


def _take(harness: Harness, arm: Arm, seed: int, manifest: TaskManifest) -> dict[str, float]:
    try:
        sample = harness.sample(arm, seed)
    except Exception as exc:
        raise ArmError(arm.name, exc) from exc
    metric = manifest.metric
    needed = [metric.name] + [k for k in (metric.events, metric.trials) if k is not None]
    for key in needed:
        value = sample.get(key)
        # a rate metric's samples may be 0 (no event); any other metric is a positive quantity
        floor_ok = value >= 0 if metric.events is not None else value > 0  # type: ignore[operator]
        if not isinstance(value, int | float) or not math.isfinite(value) or not floor_ok:
            raise ArmError(arm.name, ValueError(f"harness sample has no valid '{key}': {sample}"))
    return {k: float(v) for k, v in sample.items()}


def measure(
    harness: Harness,
    baseline: Arm,
    candidate: Arm,
    manifest: TaskManifest,
    seeds: SeedSource,
    *,
    deadline: float,
    bootstrap_seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Measurement:
    """Sample both arms until the interval is tight enough or a budget runs out."""
    budget, metric = manifest.budget, manifest.metric.name
    base: dict[str, list[float]] = {}
    cand: dict[str, list[float]] = {}
    started = time.monotonic()
    rounds = 0
    while True:
        s1, s2 = seeds.fresh(), seeds.fresh()
        order = [(baseline, s1), (candidate, s1), (candidate, s2), (baseline, s2)]
        if rounds % 2:
            order = [(candidate, s1), (baseline, s1), (baseline, s2), (candidate, s2)]
        for arm, seed in order:
            if time.monotonic() > deadline:
                raise ExperimentTimeout()
            target = base if arm is baseline else cand
            for key, value in _take(harness, arm, seed, manifest).items():
                target.setdefault(key, []).append(value)
        rounds += 1
        n = min(len(base[metric]), len(cand[metric]))
        if n < max(budget.min_samples, 2):
            continue
        rate = manifest.metric.events is not None
        if rate:  # pooled counts; sequential: stop once the difference is shown either way
            counts = _pooled(base, cand, manifest)
            comparison = rates.as_comparison(counts, n, manifest.min_effect)
            done = rates.shown(counts, manifest.min_effect, manifest.metric.target) is not None
        else:
            comparison = compare_samples(
                base[metric][:n],
                cand[metric][:n],
                higher_is_better=manifest.metric.higher_is_better,
                paired=True,
                seed=bootstrap_seed,
                equivalence=manifest.min_effect,
            )
            done = (comparison.ci_high - comparison.ci_low) / comparison.speedup < (
                budget.target_ci_width
            )
        done = done and not _constraints_open(base, cand, manifest)  # shown either way first
        spent = time.monotonic() - started
        if progress is not None:
            shown = counts.render() if rate else f"{gain_name(manifest)} {comparison.speedup:.3f}x"
            progress(f"performance: n={n}/arm, {shown}")
        if done or n >= budget.max_samples or spent > budget.measure_budget_s:
            return Measurement(comparison, base, cand, rounds)


def gain_name(manifest: TaskManifest) -> str:
    """What the improvement factor is called for this task's metric (> 1 is better)."""
    if manifest.metric.events is not None:
        return "rate ratio"
    if manifest.objective == "accuracy":
        return "error ratio"
    return "speedup"


def _pooled(
    base: dict[str, list[float]], cand: dict[str, list[float]], manifest: TaskManifest
) -> rates.RateComparison:
    metric = manifest.metric
    assert metric.events is not None and metric.trials is not None
    return rates.pooled(base, cand, metric.events, metric.trials, metric.per)


def sign_interval(ratios: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free interval for the median per-pair ratio (the sign test's order
    statistics): exact coverage >= `confidence` for independent pairs, whatever the noise.
    None when there are too few pairs to reach that confidence."""
    n = len(ratios)
    alpha = (1.0 - confidence) / 2
    k, tail = 0, 0.0
    while True:  # largest k with P(Binom(n, 1/2) <= k - 1) <= alpha
        tail_next = tail + math.comb(n, k) / 2**n
        if tail_next > alpha:
            break
        tail, k = tail_next, k + 1
    if k == 0:
        return None
    ordered = sorted(ratios)
    return ordered[k - 1], ordered[n - k]


def pair_ratios(m: Measurement, manifest: TaskManifest) -> list[float]:
    """Per-pair speedups (same seed, measured next to each other), > 1 is better."""
    name = manifest.metric.name
    pairs = zip(m.baseline[name], m.candidate[name], strict=False)
    if manifest.metric.higher_is_better:
        return [c / b for b, c in pairs]
    return [b / c for b, c in pairs]


def evidence(m: Measurement, manifest: TaskManifest) -> PerformanceEvidence:
    c, metric = m.comparison, manifest.metric
    return PerformanceEvidence(
        metric=metric.name,
        unit=metric.unit,
        higher_is_better=metric.higher_is_better,
        baseline_median=c.baseline_median,
        candidate_median=c.candidate_median,
        speedup=c.speedup,
        ci_low=c.ci_low,
        ci_high=c.ci_high,
        n_samples=min(c.n_baseline, c.n_candidate),
        baseline_samples=m.baseline[metric.name],
        candidate_samples=m.candidate[metric.name],
        noise=c.noise,
        min_effect=manifest.min_effect,
        gain=gain_name(manifest),
        method=(
            f"interleaved ABBA rounds on fresh seeds ({m.rounds} rounds); {c.method}"
            + (
                ""
                if metric.events is not None
                else "; a decision also needs the sign test's 95% interval of per-pair "
                "ratios to agree"
            )
        ),
    )


def decide(
    m: Measurement, manifest: TaskManifest
) -> tuple[Verdict, list[str], list[Flag], dict[str, float]]:
    """Verdict, reasons, flags and secondary metrics (medians) from a measurement.

    IMPROVED only if the improvement factor exceeds 1 + min_effect, the interval's low end exceeds
    1 + min_effect/2 (confident of at least half the minimum effect, not merely of some change:
    two worker processes running the same code differ by a percent or two, which a 95% interval
    alone would call a change in one A/A experiment of ten on a loaded machine) and the sign
    test's interval of per-pair ratios excludes 1.0 (where it applies: at least 6 pairs);
    REGRESSED symmetrically; NO_CHANGE otherwise. A rate metric is judged on pooled counts
    instead (experiments.rates). Every constraint must be shown satisfied (its interval within
    the limit): one shown broken is a REGRESSED, one not shown satisfied keeps the verdict from
    IMPROVED."""
    c, metric = m.comparison, manifest.metric
    sp, lo, hi, effect = c.speedup, c.ci_low, c.ci_high, manifest.min_effect
    margin = 1.0 + effect / 2
    gain = gain_name(manifest)
    numbers = (
        f"{gain} {sp:.3f}x (95% CI {lo:.3f}-{hi:.3f}, n={min(c.n_baseline, c.n_candidate)}/arm); "
        f"{metric.name} median {c.baseline_median:.4g} -> {c.candidate_median:.4g} {metric.unit}"
    )
    if metric.events is not None:
        verdict, reasons = _decide_rate(m, manifest)
    elif lo > margin and sp > 1.0 + effect:
        verdict, reasons = Verdict.IMPROVED, [f"better with confidence: {numbers}"]
    elif hi < 1.0 / margin and sp < 1.0 / (1.0 + effect):
        verdict, reasons = Verdict.REGRESSED, [f"worse with confidence: {numbers}"]
    elif lo <= 1.0 <= hi:
        verdict, reasons = (
            Verdict.NO_CHANGE,
            [f"within noise, the interval includes 1.0: {numbers}"],
        )
    elif sp > 1.0 + effect or sp < 1.0 / (1.0 + effect):
        verdict = Verdict.NO_CHANGE
        reasons = [
            f"not shown: the interval reaches within half the task's minimum effect of "
            f"{effect:.0%} ({1 / margin:.3f}-{margin:.3f}); {numbers}"
        ]
    else:
        verdict = Verdict.NO_CHANGE
        reasons = [f"effect below the task's minimum of {effect:.0%}: {numbers}"]
    if verdict in (Verdict.IMPROVED, Verdict.REGRESSED) and metric.events is None:
        # The bootstrap interval of medians can be too narrow when noise is heavy-tailed or
        # drifts (a loaded machine); the sign test's interval holds whatever the noise.
        # It applies where it can reach 95% (6 pairs or more); with fewer the bootstrap decides
        # alone. (Samples are positive: compare_samples refuses others.)
        sign = sign_interval(pair_ratios(m, manifest))
        if sign is not None and not (
            sign[0] > 1.0 if verdict == Verdict.IMPROVED else sign[1] < 1.0
        ):
            verdict = Verdict.NO_CHANGE
            reasons = [
                "not shown: the sign test's 95% interval of per-pair ratios "
                f"({sign[0]:.3f}-{sign[1]:.3f}) includes 1.0; {numbers}"
            ]
    flags: list[Flag] = []
    if {"high_iqr", "drift"} & set(c.noise):
        flags.append(Flag.NOISY)
        reasons.append("measurement was noisy: " + "; ".join(c.noise_detail))
    if manifest.plausible_speedup is not None and sp > manifest.plausible_speedup:
        flags.append(Flag.SUSPICIOUS)
        reasons.append(
            f"{gain} {sp:.2f}x is above the task's plausibility bound "
            f"{manifest.plausible_speedup:g}x: needs a human look"
        )
    medians: dict[str, float] = {}
    for name in sorted(set(m.baseline) & set(m.candidate)):
        if name == metric.name:
            continue
        medians[f"baseline_{name}"] = _median(m.baseline[name])
        medians[f"candidate_{name}"] = _median(m.candidate[name])
    for constraint in manifest.constraints:
        verdict = _constraint(m, constraint, verdict, reasons)
    return verdict, reasons, flags, medians


def _decide_rate(m: Measurement, manifest: TaskManifest) -> tuple[Verdict, list[str]]:
    """A rate metric: the pooled counts decide (experiments.rates)."""
    counts = _pooled(m.baseline, m.candidate, manifest)
    target = manifest.metric.target
    outcome = rates.shown(counts, manifest.min_effect, target)
    low, _ = counts.interval()
    if outcome == "better":
        return Verdict.IMPROVED, [f"fewer events with confidence: {counts.render()}"]
    if outcome == "worse":
        return Verdict.REGRESSED, [f"more events with confidence: {counts.render()}"]
    margin = 1.0 + manifest.min_effect / 2
    if low > margin and target is not None:
        why = (
            f"fewer events, but not shown below the task's target of {target:g} "
            f"{manifest.metric.unit} (the candidate's 95% upper bound is "
            f"{counts.candidate_upper:.3g}: more requests needed)"
        )
    else:
        why = "the difference is not shown (the interval reaches within half the minimum effect)"
    return Verdict.NO_CHANGE, [f"{why}: {counts.render()}"]


def constraint_interval(
    baseline: dict[str, list[float]], candidate: dict[str, list[float]], constraint: Constraint
) -> tuple[float, float, float] | None:
    """The constraint's ratio (grows as the candidate gets worse) and its paired 95% interval,
    or None if the harness did not measure its metric."""
    b, k = baseline.get(constraint.metric), candidate.get(constraint.metric)
    if not b or not k:
        return None
    n = min(len(b), len(k))
    comp = compare_samples(b[:n], k[:n], higher_is_better=constraint.higher_is_better, paired=True)
    return 1 / comp.speedup, 1 / comp.ci_high, 1 / comp.ci_low


def _constraints_open(
    baseline: dict[str, list[float]], candidate: dict[str, list[float]], manifest: TaskManifest
) -> bool:
    """True while some constraint is neither shown satisfied nor shown broken."""
    for constraint in manifest.constraints:
        found = constraint_interval(baseline, candidate, constraint)
        if found is not None and found[1] <= constraint.max_ratio < found[2]:
            return True
    return False


def _constraint(
    m: Measurement, constraint: Constraint, verdict: Verdict, reasons: list[str]
) -> Verdict:
    """Check one constraint; returns the verdict it leaves. Shown satisfied: the whole 95%
    interval of its ratio within the limit. Shown broken (the whole interval beyond it):
    REGRESSED. Neither: 'constraint not shown satisfied', never IMPROVED."""
    found = constraint_interval(m.baseline, m.candidate, constraint)
    if found is None:
        reasons.append(f"constraint metric '{constraint.metric}' was not measured by the harness")
        return Verdict.FAILED
    ratio, ratio_low, ratio_high = found
    bm, km = _median(m.baseline[constraint.metric]), _median(m.candidate[constraint.metric])
    numbers = (
        f"{constraint.metric} median {bm:.4g} -> {km:.4g} (ratio {ratio:.3f}, 95% CI "
        f"{ratio_low:.3f}-{ratio_high:.3f}, allowed {constraint.max_ratio:g})"
    )
    if ratio_low > constraint.max_ratio:
        reasons.append(f"constraint broken: {numbers}")
        return Verdict.REGRESSED if verdict != Verdict.FAILED else verdict
    if ratio_high > constraint.max_ratio:
        reasons.append(f"constraint not shown satisfied: {numbers}")
        return Verdict.NO_CHANGE if verdict == Verdict.IMPROVED else verdict
    return verdict


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
