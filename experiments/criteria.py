"""A task's success criteria in words, and whether one experiment met each of them.

The criteria are what the task declares: the verdict rule (better than baseline by more than its
minimum effect, correct), the story's targets (`[[targets]]`, a rate metric's `target`) and the
constraints. They are stated in the agent's first message and checked beside every verdict, so
the model need not build its own check; the verdict itself is decided by the judgement core
(`judgement.decision`, through `experiments.measure`).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from infra_agent.store.verdict import ExperimentResult, PerformanceEvidence, Verdict
from infra_agent.tasks.manifest import Constraint, Target, TaskManifest

Status = Literal["met", "not met", "not shown", "not measured", "broken"]


class CriterionOutcome(NamedTuple):
    """One target or constraint judged on one experiment: met only when shown."""

    status: Status
    line: str
    """The criterion, its outcome and its number, in words."""


def _target(t: Target) -> str:
    if t.gain is not None:
        return f"target {t.metric} at least {t.gain:g}x better than baseline (95% interval's low end)"  # fmt: skip
    bound = f"below {t.below:g}" if t.below is not None else f"above {t.above:g}"
    return f"target {t.metric} {bound} (candidate median)"


def _constraint(c: Constraint) -> str:
    return (
        f"constraint {c.metric} at most {c.max_ratio:g}x worse than baseline (the 95% interval "
        "of the ratio within it)"
    )


def success_criteria(manifest: TaskManifest) -> list[str]:
    """What counts as a success on this task, one criterion a line, with its numbers."""
    m = manifest.metric
    if m.events is not None:
        rule = f"IMPROVED: fewer {m.events} per {m.per:g} {m.trials} than baseline (pooled counts, exact 95% interval)"  # fmt: skip
    else:
        better = "higher" if m.higher_is_better else "lower"
        rule = f"IMPROVED: {m.name} {better} than baseline by more than {manifest.min_effect:.0%} at 95% confidence"  # fmt: skip
    lines = [rule + ", correct on fresh inputs, every invariant kept"]
    if m.target is not None:
        lines.append(f"target {m.name} below {m.target:g} {m.unit} (the candidate's 95% upper bound)")  # fmt: skip
    lines.extend(_target(t) for t in manifest.targets)
    lines.extend(_constraint(c) for c in manifest.constraints)
    return lines


def _median(perf: PerformanceEvidence, metrics: dict[str, float], name: str, arm: str) -> float | None:  # fmt: skip
    if name == perf.metric:
        return perf.candidate_median if arm == "candidate" else perf.baseline_median
    return metrics.get(f"{arm}_{name}")


def _target_outcome(t: Target, perf: PerformanceEvidence, metrics: dict[str, float]) -> CriterionOutcome:  # fmt: skip
    """The numbers the verdict states already (its gain, interval and the metric's medians) are
    not repeated."""
    if t.gain is not None:
        lo, sp = perf.ci_low, perf.speedup
        met: Status = "met" if lo >= t.gain else "not shown" if sp >= t.gain else "not met"
        why = {"met": "the interval's low end reaches it", "not shown": "the point estimate reaches it, the interval's low end does not", "not met": "the point estimate is below it"}[met]  # fmt: skip
        return CriterionOutcome(met, f"target {perf.gain} >= {t.gain:g}x: {met} ({why})")
    value = _median(perf, metrics, t.metric, "candidate")
    below = t.below is not None
    bound = t.below if t.below is not None else t.above
    assert bound is not None  # Target: exactly one of below, above, gain
    head = f"target {t.metric} {'<' if below else '>'} {bound:g}"
    if value is None:
        return CriterionOutcome("not measured", f"{head}: not measured (the harness did not report {t.metric})")  # fmt: skip
    reached = value < bound if below else value > bound
    status: Status = "met" if reached else "not met"
    if t.metric == perf.metric:  # its medians are in the verdict
        return CriterionOutcome(status, f"{head}: {status} (candidate median)")
    base = _median(perf, metrics, t.metric, "baseline")
    was = f"; baseline {base:.4g}" if base is not None else ""
    return CriterionOutcome(status, f"{head}: {status} ({value:.4g}{was})")


def _times(ratio: float) -> str:
    """A constraint's ratio (times worse than baseline) said with its direction."""
    return f"{ratio:.3f}x worse" if ratio >= 1 else f"{1 / ratio:.3f}x better"


def _constraint_outcome(c: Constraint, metrics: dict[str, float]) -> CriterionOutcome:
    head = f"constraint {c.metric} at most {c.max_ratio:g}x worse than baseline"
    ratio = metrics.get(f"{c.metric}_ratio")
    low, high = metrics.get(f"{c.metric}_ratio_low"), metrics.get(f"{c.metric}_ratio_high")
    if ratio is None or low is None or high is None:
        return CriterionOutcome("not measured", f"{head}: not measured")
    met: Status = "met" if high <= c.max_ratio else "broken" if low > c.max_ratio else "not shown"
    if met != "met":  # the verdict's reasons state its numbers (judgement.constraints.check)
        return CriterionOutcome(met, f"{head}: {met}")
    return CriterionOutcome(met, f"{head}: {met} ({_times(ratio)}; at worst {_times(high)} at 95%)")


def _declares_criteria(manifest: TaskManifest) -> bool:
    return bool(manifest.targets or manifest.constraints or manifest.metric.target is not None)


def criteria_results(manifest: TaskManifest, result: ExperimentResult) -> list[CriterionOutcome]:
    """Each target and constraint of the task judged on `result` (a rate target first); nothing
    when the task declares none or the experiment never reached the performance stage."""
    m, perf = manifest.metric, result.evidence.performance
    if not _declares_criteria(manifest) or perf is None:
        return []
    metrics = result.evidence.metrics
    out = []
    if m.target is not None:
        upper = metrics.get("candidate_rate_upper")
        head = f"target {m.name} < {m.target:g} {m.unit} (95% upper bound)"
        if upper is None:
            out.append(CriterionOutcome("not measured", f"{head}: not measured"))
        else:  # the bound itself is in the verdict's counts (judgement.rates.RateComparison.render_counts)
            status: Status = "met" if upper < m.target else "not met"
            out.append(CriterionOutcome(status, f"{head}: {status}"))
    out.extend(_target_outcome(t, perf, metrics) for t in manifest.targets)
    out.extend(_constraint_outcome(c, metrics) for c in manifest.constraints)
    return out


def success(manifest: TaskManifest, result: ExperimentResult) -> bool:
    """The task's own success criterion: IMPROVED (correct, better than baseline beyond the
    minimum effect) and every declared target and constraint shown met. A task that declares
    none succeeds on IMPROVED alone."""
    if result.verdict is not Verdict.IMPROVED:
        return False
    if not _declares_criteria(manifest):
        return True
    found = criteria_results(manifest, result)
    return bool(found) and all(c.status == "met" for c in found)


def criteria_outcome(manifest: TaskManifest, result: ExperimentResult) -> list[str]:
    """Each target and constraint of the task, met or not, with its number; nothing when the task
    declares none (the verdict is then the whole criterion)."""
    if not _declares_criteria(manifest):
        return []
    if result.evidence.performance is None:
        stage = result.evidence.stage_reached or "no"
        return [f"task criteria: not measured (the experiment stopped at the {stage} stage)"]
    return ["task criteria:", *(f"- {c.line}" for c in criteria_results(manifest, result))]
