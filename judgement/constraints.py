"""Constraints: secondary metrics a candidate must be shown not to worsen beyond a limit.

A constraint's ratio (candidate over baseline, oriented so that it grows as the candidate gets
worse) gets a paired 95% interval. It is shown satisfied when the whole interval is within the
limit, shown broken when the whole interval is beyond it; the measurement samples on while any
constraint is neither (`still_open`), and `check` turns the outcome into the verdict it leaves.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median
from typing import Protocol

from infra_agent.judgement.bootstrap import compare_samples
from infra_agent.store.verdict import Verdict

Samples = dict[str, list[float]]
"""Metric name -> samples of one arm, in measurement order."""


class Limit(Protocol):
    """A constraint as the judgement reads it (a task's `[[constraints]]`, tasks.manifest)."""

    @property
    def metric(self) -> str: ...
    @property
    def max_ratio(self) -> float:
        """The largest ratio allowed, oriented so that it grows as the candidate gets worse."""
        ...

    @property
    def higher_is_better(self) -> bool: ...


def constraint_interval(
    baseline: Samples, candidate: Samples, constraint: Limit
) -> tuple[float, float, float] | None:
    """The constraint's ratio (grows as the candidate gets worse) and its paired 95% interval,
    or None if the harness did not measure its metric."""
    b, k = baseline.get(constraint.metric), candidate.get(constraint.metric)
    if not b or not k:
        return None
    n = min(len(b), len(k))
    comp = compare_samples(b[:n], k[:n], higher_is_better=constraint.higher_is_better, paired=True)
    return 1 / comp.speedup, 1 / comp.ci_high, 1 / comp.ci_low


def still_open(baseline: Samples, candidate: Samples, constraints: Sequence[Limit]) -> bool:
    """True while some constraint is neither shown satisfied nor shown broken."""
    for constraint in constraints:
        found = constraint_interval(baseline, candidate, constraint)
        if found is not None and found[1] <= constraint.max_ratio < found[2]:
            return True
    return False


def check(
    baseline: Samples,
    candidate: Samples,
    constraint: Limit,
    verdict: Verdict,
    reasons: list[str],
    metrics: dict[str, float] | None = None,
) -> Verdict:
    """Check one constraint; returns the verdict it leaves. Shown satisfied: the whole 95%
    interval of its ratio within the limit. Shown broken (the whole interval beyond it):
    REGRESSED. Neither: 'constraint not shown satisfied', never IMPROVED. The ratio and its
    interval go into `metrics` (`<metric>_ratio`, `_ratio_low`, `_ratio_high`)."""
    found = constraint_interval(baseline, candidate, constraint)
    if found is None:
        reasons.append(f"constraint metric '{constraint.metric}' was not measured by the harness")
        return Verdict.FAILED
    ratio, ratio_low, ratio_high = found
    if metrics is not None:
        name = constraint.metric
        metrics |= {f"{name}_ratio": ratio, f"{name}_ratio_low": ratio_low, f"{name}_ratio_high": ratio_high}  # fmt: skip
    bm, km = median(baseline[constraint.metric]), median(candidate[constraint.metric])
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
