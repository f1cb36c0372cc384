"""Diff two timeline summaries: what got faster, slower, appeared or vanished.

`diff_summaries(baseline, candidate) -> TimelineDiff` compares per-op self time (the `ops`
tables), the span, and per-class totals. Changes below `min_change_us` are ignored.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, Field

from infra_agent.feedback.timeline.summary import TimelineSummary


class OpChange(BaseModel):
    name: str
    baseline_us: float
    candidate_us: float
    delta_us: float
    """candidate - baseline (negative: faster)."""
    status: str
    """faster | slower | appeared | vanished"""


class TimelineDiff(BaseModel):
    span_baseline_us: float
    span_candidate_us: float
    classes_delta_us: dict[str, float] = Field(default_factory=dict)
    changes: list[OpChange] = Field(default_factory=list)
    """Largest |delta| first."""

    def render(self, max_items: int = 8) -> str:
        ratio = self.span_baseline_us / self.span_candidate_us if self.span_candidate_us else 0.0
        lines = [
            f"span {self.span_baseline_us / 1e3:.3f} -> {self.span_candidate_us / 1e3:.3f} ms "
            f"({ratio:.2f}x)",
            "classes: "
            + ", ".join(f"{k} {v / 1e3:+.3f} ms" for k, v in self.classes_delta_us.items()),
        ]
        for c in self.changes[:max_items]:
            lines.append(
                f"  {c.status:9s} {c.name[:60]}: {c.baseline_us / 1e3:.3f} -> "
                f"{c.candidate_us / 1e3:.3f} ms ({c.delta_us / 1e3:+.3f})"
            )
        return "\n".join(lines)


def _classes(s: TimelineSummary) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for t in s.tracks:
        for k, v in t.classes_us.items():
            out[k] += v
    return out


def diff_summaries(
    baseline: TimelineSummary, candidate: TimelineSummary, *, min_change_us: float = 1.0
) -> TimelineDiff:
    base = {o.name: o.total_us for o in baseline.ops}
    cand = {o.name: o.total_us for o in candidate.ops}
    changes = []
    for name in dict.fromkeys([*base, *cand]):
        b, c = base.get(name, 0.0), cand.get(name, 0.0)
        if abs(c - b) < min_change_us:
            continue
        status = (
            "appeared" if name not in base else "vanished" if name not in cand
            else "slower" if c > b else "faster"
        )  # fmt: skip
        changes.append(
            OpChange(name=name, baseline_us=b, candidate_us=c, delta_us=c - b, status=status)
        )
    changes.sort(key=lambda c: -abs(c.delta_us))
    cb, cc = _classes(baseline), _classes(candidate)
    return TimelineDiff(
        span_baseline_us=baseline.span_us,
        span_candidate_us=candidate.span_us,
        classes_delta_us={k: cc.get(k, 0.0) - cb.get(k, 0.0) for k in dict.fromkeys([*cb, *cc])},
        changes=changes,
    )
