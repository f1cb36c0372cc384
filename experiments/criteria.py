"""A task's success criteria in words, and whether one experiment met each of them.

The criteria are what the task declares: the verdict rule (better than baseline by more than its
minimum effect, correct), the story's targets (`[[targets]]`, a rate metric's `target`) and the
constraints. They are stated in the agent's first message and checked beside every verdict, so
the model need not build its own check; the verdict itself is decided in `experiments.measure`.
"""

from __future__ import annotations

from infra_agent.store.verdict import ExperimentResult, PerformanceEvidence
from infra_agent.tasks.manifest import Constraint, Target, TaskManifest


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


def _target_outcome(t: Target, perf: PerformanceEvidence, metrics: dict[str, float]) -> str:
    if t.gain is not None:
        lo, sp = perf.ci_low, perf.speedup
        met = "met" if lo >= t.gain else "not shown" if sp >= t.gain else "not met"
        return f"target {perf.gain} >= {t.gain:g}x: {met} ({sp:.3f}x, 95% CI {lo:.3f}-{perf.ci_high:.3f})"  # fmt: skip
    value = _median(perf, metrics, t.metric, "candidate")
    below = t.below is not None
    bound = t.below if t.below is not None else t.above
    assert bound is not None  # Target: exactly one of below, above, gain
    head = f"target {t.metric} {'<' if below else '>'} {bound:g}"
    if value is None:
        return f"{head}: not measured (the harness did not report {t.metric})"
    reached = value < bound if below else value > bound
    base = _median(perf, metrics, t.metric, "baseline")
    was = f"; baseline {base:.4g}" if base is not None else ""
    return f"{head}: {'met' if reached else 'not met'} ({value:.4g}{was})"


def _constraint_outcome(c: Constraint, metrics: dict[str, float]) -> str:
    head = f"constraint {c.metric} ratio to baseline <= {c.max_ratio:g}"
    ratio = metrics.get(f"{c.metric}_ratio")
    low, high = metrics.get(f"{c.metric}_ratio_low"), metrics.get(f"{c.metric}_ratio_high")
    if ratio is None or low is None or high is None:
        return f"{head}: not measured"
    met = "met" if high <= c.max_ratio else "broken" if low > c.max_ratio else "not shown"
    return f"{head}: {met} (ratio {ratio:.3f}, 95% CI {low:.3f}-{high:.3f})"


def criteria_outcome(manifest: TaskManifest, result: ExperimentResult) -> list[str]:
    """Each target and constraint of the task, met or not, with its number; nothing when the task
    declares none (the verdict is then the whole criterion)."""
    m = manifest.metric
    if not manifest.targets and not manifest.constraints and m.target is None:
        return []
    perf = result.evidence.performance
    if perf is None:
        stage = result.evidence.stage_reached or "no"
        return [f"task criteria: not measured (the experiment stopped at the {stage} stage)"]
    metrics = result.evidence.metrics
    lines = []
    if m.target is not None:
        upper = metrics.get("candidate_rate_upper")
        head = f"target {m.name} < {m.target:g} {m.unit} (95% upper bound)"
        lines.append(
            f"{head}: {'met' if upper < m.target else 'not met'} ({upper:.3g})"
            if upper is not None
            else f"{head}: not measured"
        )
    lines.extend(_target_outcome(t, perf, metrics) for t in manifest.targets)
    lines.extend(_constraint_outcome(c, metrics) for c in manifest.constraints)
    return ["task criteria:", *(f"- {line}" for line in lines)]
