"""The performance stage: interleaved samples of both arms, adaptive stopping, and the decision.

Samples come in rounds of four in ABBA / BAAB order on two fresh seeds, so each arm runs each
input once and slow drift of the machine hits both arms alike. Pairs (same seed) feed a paired
bootstrap of the per-pair ratios (`judgement.bootstrap.compare_samples`). After a calibration of
`CALIBRATION_PAIRS` pairs the experiment states the noise it measured and the smallest change it
can detect at its budget (`judgement/power.py`), and whether that is as fine as asked: the
task's `target_ci_width`, or a finer `detect` of the caller. Sampling stops once the interval is
that precise (for a rate metric, judged on pooled counts by `judgement/rates.py`: once the
difference is shown either way) and every constraint is shown satisfied or broken
(`judgement/constraints.py`), with at least `min_samples` per arm; or at `max_samples`, or
when `measure_budget_s` is spent. A NO_CHANGE that stopped short of the precision asked for is
flagged `underpowered` and says what it could and could not see. An extension
(`experiments/extend.py`) starts from an earlier experiment's pairs and adds at most
`max_samples` more. The verdict is the judgement core's (`judgement.decision.decide`); this
module samples, and states the task's metric, companion and constraints beside it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from infra_agent.experiments.arms import SeedSource
from infra_agent.experiments.companion import companion, unshared_gain
from infra_agent.experiments.extend import Prior
from infra_agent.judgement import constraints, power, rates
from infra_agent.judgement.bootstrap import compare_samples
from infra_agent.judgement.comparison import Comparison
from infra_agent.judgement.decision import (
    SUSPICIOUS,
    Decision,
    Rule,
    caveats,
    settled,
)
from infra_agent.judgement.decision import decide as decide_comparison
from infra_agent.store.verdict import Flag, PerformanceEvidence, StopReason, Verdict
from infra_agent.tasks.harness import Arm, Harness
from infra_agent.tasks.manifest import TaskManifest


class ArmError(Exception):
    """A failure raised while running one arm (wraps the harness's exception)."""

    def __init__(self, arm: str, error: BaseException) -> None:
        super().__init__(f"{arm}: {error}")
        self.arm = arm
        self.error = error


class ExperimentTimeout(Exception):
    """The whole experiment ran past `budget.experiment_timeout_s`."""


CALIBRATION_PAIRS = 4
"""Pairs measured before an experiment states what it can detect (two ABBA rounds)."""


@dataclass
class Measurement:
    comparison: Comparison
    baseline: dict[str, list[float]] = field(default_factory=dict)
    """Metric name -> samples, in measurement order."""
    candidate: dict[str, list[float]] = field(default_factory=dict)
    rounds: int = 0
    wanted: float = math.inf
    """The detectable effect asked for (a speedup, e.g. 1.10)."""
    plan: power.Plan | None = None
    """What the calibration said the budget can resolve."""
    stopped: StopReason | None = None
    """Why sampling stopped."""
    prior: Prior | None = None
    """The earlier experiment this one extends (its pairs come first), if any."""


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


def wanted_effect(manifest: TaskManifest, detect: float | None = None) -> float:
    """The detectable effect an experiment aims for: 1 + `detect` when a caller asks for one,
    else what the task's `target_ci_width` resolves."""
    if detect is not None:
        return 1.0 + detect
    width = power.se_of_width(manifest.budget.target_ci_width)
    return power.detectable_effect(width, manifest.min_effect)


def _ratios(base: list[float], cand: list[float], higher_is_better: bool) -> list[float]:
    pairs = zip(base, cand, strict=False)
    return [c / b for b, c in pairs] if higher_is_better else [b / c for b, c in pairs]


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
    detect: float | None = None,
    prior: Prior | None = None,
) -> Measurement:
    """Sample both arms until the interval resolves the wanted effect (a rate metric: until the
    difference is shown) and every constraint is shown either way, or a budget runs out. With
    `prior` (an extension: the same arms), its pairs come first and at most `max_samples` more
    are taken."""
    budget, metric = manifest.budget, manifest.metric.name
    rate = manifest.metric.events is not None
    wanted = math.inf if rate else wanted_effect(manifest, detect)
    if prior is not None and prior.wanted is not None:  # an extension asks what its start asked
        wanted = prior.wanted
    se_goal = power.se_for_effect(wanted, manifest.min_effect)
    base = {k: list(v) for k, v in prior.baseline.items()} if prior is not None else {}
    cand = {k: list(v) for k, v in prior.candidate.items()} if prior is not None else {}
    reused = prior.pairs if prior is not None else 0
    cap = budget.max_samples + reused
    plan: power.Plan | None = None
    started = time.monotonic()
    rounds = reused // 2
    while True:
        _sample_round(harness, (baseline, candidate), seeds, rounds, deadline, manifest, (base, cand))  # fmt: skip
        rounds += 1
        n = min(len(base[metric]), len(cand[metric]))
        spent = time.monotonic() - started
        if not rate and plan is None and n >= min(CALIBRATION_PAIRS, max(budget.max_samples, 2)):
            ratios = _ratios(base[metric][:n], cand[metric][:n], manifest.metric.higher_is_better)
            plan = power.plan(
                power.Noise.of(ratios, spent, timed=n - reused),
                wanted=wanted, min_effect=manifest.min_effect, max_pairs=cap,
                seconds_left=budget.measure_budget_s - spent, taken=n,
            )  # fmt: skip
            if progress is not None:
                progress(plan.render())
        if n < max(budget.min_samples, 2):
            continue
        comparison, done, shown = _standing(base, cand, n, manifest, (wanted, se_goal), bootstrap_seed)  # fmt: skip
        if progress is not None:
            progress(f"performance: n={n}/arm, {shown}")
        stopped = (
            StopReason.RESOLVED if done
            else StopReason.MAX_SAMPLES if n >= cap
            else StopReason.TIME_BUDGET if spent > budget.measure_budget_s
            else None
        )  # fmt: skip
        if stopped is not None:
            return Measurement(comparison, base, cand, rounds, wanted, plan, stopped, prior)


def _sample_round(
    harness: Harness,
    arms: tuple[Arm, Arm],
    seeds: SeedSource,
    rounds: int,
    deadline: float,
    manifest: TaskManifest,
    into: tuple[dict[str, list[float]], dict[str, list[float]]],
) -> None:
    """One round of four samples on two fresh seeds, ABBA (BAAB on odd rounds), appended to
    `into` (baseline, candidate: metric name -> samples)."""
    baseline, candidate = arms
    s1, s2 = seeds.fresh(), seeds.fresh()
    order = [(baseline, s1), (candidate, s1), (candidate, s2), (baseline, s2)]
    if rounds % 2:
        order = [(candidate, s1), (baseline, s1), (baseline, s2), (candidate, s2)]
    for arm, seed in order:
        if time.monotonic() > deadline:
            raise ExperimentTimeout()
        target = into[0] if arm is baseline else into[1]
        for key, value in _take(harness, arm, seed, manifest).items():
            target.setdefault(key, []).append(value)


def _standing(
    base: dict[str, list[float]],
    cand: dict[str, list[float]],
    n: int,
    manifest: TaskManifest,
    goal: tuple[float, float],
    bootstrap_seed: int,
) -> tuple[Comparison, bool, str]:
    """The comparison of the first `n` pairs, whether sampling may stop, and the line that says
    where it stands. `goal`: the effect wanted and the standard error that resolves it."""
    metric = manifest.metric.name
    if manifest.metric.events is not None:  # pooled counts: stop once shown either way
        counts = _pooled(base, cand, manifest)
        comparison = rates.as_comparison(counts, n, manifest.min_effect)
        done = rates.shown(counts, manifest.min_effect, manifest.metric.target) is not None
        shown = counts.render()
    else:
        wanted, se_goal = goal
        comparison = compare_samples(
            base[metric][:n],
            cand[metric][:n],
            higher_is_better=manifest.metric.higher_is_better,
            paired=True,
            seed=bootstrap_seed,
            equivalence=manifest.min_effect,
        )
        ratios = _ratios(base[metric][:n], cand[metric][:n], manifest.metric.higher_is_better)
        done = settled(comparison, rule(manifest), ratios, se_goal)
        se = power.se_of_interval(comparison.ci_low, comparison.ci_high)
        seen = power.detectable_effect(se, manifest.min_effect)
        shown = (
            f"{gain_name(manifest)} {comparison.speedup:.3f}x "
            f"(95% CI {comparison.ci_low:.3f}-{comparison.ci_high:.3f}), "
            f"detects {seen - 1:.1%} (it aims to detect {wanted - 1:.1%})"
        )
    # every constraint shown either way first
    done = done and not constraints.still_open(base, cand, manifest.constraints)
    return comparison, done, shown


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


def pair_ratios(m: Measurement, manifest: TaskManifest) -> list[float]:
    """Per-pair speedups (same seed, measured next to each other), > 1 is better."""
    name = manifest.metric.name
    return _ratios(m.baseline[name], m.candidate[name], manifest.metric.higher_is_better)


def evidence(m: Measurement, manifest: TaskManifest) -> PerformanceEvidence:
    c, metric = m.comparison, manifest.metric
    rate = metric.events is not None
    seen = None if rate else _resolution(m, manifest)
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
        pair_noise=seen.noise if seen is not None else None,
        detectable_effect=seen.seen if seen is not None else None,
        wanted_effect=m.wanted if math.isfinite(m.wanted) else None,
        calibration=m.plan.render() if m.plan is not None else "",
        pairs_needed=seen.needed if seen is not None else None,
        stopped=m.stopped,
        all_samples={"baseline": m.baseline, "candidate": m.candidate},
        extended_from=m.prior.experiment_id if m.prior is not None else None,
        reused_pairs=m.prior.pairs if m.prior is not None else 0,
        method=(
            f"interleaved ABBA rounds on fresh seeds ({m.rounds} rounds); {c.method}"
            + (
                ""
                if rate
                else "; a decision also needs the sign test's 95% interval of per-pair "
                "ratios to agree"
            )
        ),
    )


def rule(manifest: TaskManifest) -> Rule:
    """What the task asks of a comparison: its minimum effect and plausibility bound."""
    return Rule(manifest.min_effect, manifest.plausible_speedup, gain_name(manifest))


def _decision(m: Measurement, manifest: TaskManifest) -> Decision:
    """The judgement core's decision on the task's metric (judgement.decision; a rate metric:
    on pooled counts, judgement.rates)."""
    metric = manifest.metric
    if metric.events is None:
        return decide_comparison(m.comparison, rule(manifest), pair_ratios(m, manifest))
    counts = _pooled(m.baseline, m.candidate, manifest)
    found = rates.decide_counts(counts, manifest.min_effect, metric.target, metric.unit)
    return caveats(found, m.comparison, rule(manifest))


def decide(
    m: Measurement, manifest: TaskManifest
) -> tuple[Verdict, list[str], list[Flag], dict[str, float]]:
    """Verdict, reasons, flags and secondary metrics (medians) from a measurement.

    The task's metric decides (`judgement.decision`: beyond the minimum effect with confidence,
    the sign test agreeing; a rate metric on pooled counts, `judgement.rates`), flagged
    `underpowered` when the measurement could not resolve the effect asked for. Every
    constraint must be shown satisfied (its interval within the limit): one shown broken is a
    REGRESSED, one not shown satisfied keeps the verdict from IMPROVED
    (`judgement.constraints`). The metric's companion is compared beside it and does not
    decide, but an IMPROVED it does not share is flagged `suspicious` (experiments.companion).

    The reasons are words and the numbers only they carry: the gain, its interval, the pairs
    and the medians are in the evidence (`evidence`) and stated once beside the verdict."""
    metric = manifest.metric
    found = _decision(m, manifest)
    verdict, reasons, flags = found.verdict, list(found.reasons), list(found.flags)
    medians: dict[str, float] = {}
    for name in sorted(set(m.baseline) & set(m.candidate)):
        if name == metric.name:
            continue
        medians[f"baseline_{name}"] = statistics.median(m.baseline[name])
        medians[f"candidate_{name}"] = statistics.median(m.candidate[name])
    # What the measurement of the metric could see (judged on the metric's own verdict: a
    # constraint's outcome says nothing of its precision), and its companion.
    seen = ([], []) if metric.events is not None else resolution(m, manifest, verdict)
    for constraint in manifest.constraints:
        verdict = constraints.check(m.baseline, m.candidate, constraint, verdict, reasons, medians)
    if metric.events is not None:  # what a rate target is judged on (experiments.criteria)
        medians["candidate_rate_upper"] = _pooled(m.baseline, m.candidate, manifest).candidate_upper
        return verdict, reasons, flags, medians
    beside, shared = companion(m.baseline, m.candidate, manifest, medians)
    reasons[1:1] = seen[1] + beside  # right after the main reason
    unshared = (
        unshared_gain(m.comparison.speedup, shared, manifest)
        if verdict is Verdict.IMPROVED
        else None
    )
    if unshared is not None:
        flags.append(Flag.SUSPICIOUS)
        reasons.append(f"{SUSPICIOUS}{unshared}")
    return verdict, reasons, flags + seen[0], medians


def resolution(
    m: Measurement, manifest: TaskManifest, verdict: Verdict
) -> tuple[list[Flag], list[str]]:
    """What the measurement could see, in one line (`power.Resolution`); a NO_CHANGE that could
    not see the effect asked for is flagged `underpowered`."""
    seen = _resolution(m, manifest)
    flags = [Flag.UNDERPOWERED] if verdict is Verdict.NO_CHANGE and not seen.resolved else []
    return flags, [seen.render(no_change=verdict is Verdict.NO_CHANGE)]


def _resolution(m: Measurement, manifest: TaskManifest) -> power.Resolution:
    c = m.comparison
    return power.Resolution.of(
        pair_ratios(m, manifest),
        c.ci_low,
        c.ci_high,
        wanted=m.wanted,
        min_effect=manifest.min_effect,
    )
