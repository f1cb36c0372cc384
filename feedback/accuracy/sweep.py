"""Error growth with problem size: `error_sweep(run, sizes) -> SweepReport`.

`run(size)` returns `(candidate, reference)` tensors for one problem size (e.g. sequence
length). At each size the candidate's max |error|, RMSE and relative RMS error (RMSE over the reference's
RMS) against the reference are measured, and the slope of log(error) over log(size) is fitted by
least squares for each: slope ≈ 1 means the
error grows linearly with size, > 1 super-linearly ("rounding error accumulates with length"
becomes a number). The relative slope separates error that grows because the values grow (absolute
slope > 0, relative slope ~ 0) from error that grows faster than the values. `growth` names the regime of the max-abs slope: 'super-linear' (> 1.1),
'linear' (0.9..1.1), 'sub-linear' (0.1..0.9) or 'flat'.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.feedback.accuracy.metrics import tensor_diff

Growth = Literal["super-linear", "linear", "sub-linear", "flat"]


class SweepPoint(BaseModel):
    size: int
    max_abs: float
    rmse: float
    rel_rms: float = 0.0
    """sqrt(Σ(candidate - reference)² / Σreference²)."""
    rel_diff: float


class SweepReport(BaseModel):
    points: list[SweepPoint] = Field(default_factory=list)
    slope_max_abs: float
    """d log(max |error|) / d log(size)."""
    slope_rmse: float
    slope_rel_rms: float = 0.0
    """d log(relative RMS error) / d log(size)."""
    growth: Growth
    """Regime of the max-abs slope."""
    rel_growth: Growth = "flat"
    """Regime of the relative-RMS slope."""

    def render(self) -> str:
        pts = ", ".join(f"{p.size}: {p.max_abs:.2e}" for p in self.points[:12])
        rel = ", ".join(f"{p.size}: {p.rel_rms:.2e}" for p in self.points[:12])
        return (
            f"error growth {self.growth} in absolute terms (log-log slope {self.slope_max_abs:.2f}"
            f" max abs, {self.slope_rmse:.2f} rmse), {self.rel_growth} in relative terms "
            f"(slope {self.slope_rel_rms:.2f} of relative RMS error)\n"
            f"max abs error by size: {pts}\nrelative RMS error by size: {rel}"
        )


def loglog_slope(sizes: Sequence[float], errors: Sequence[float]) -> float:
    """Least-squares slope of log(error) on log(size); zero errors are floored at 1e-300."""
    xs = [math.log(s) for s in sizes]
    ys = [math.log(max(e, 1e-300)) for e in errors]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


def _growth(slope: float) -> Growth:
    if slope > 1.1:
        return "super-linear"
    if slope >= 0.9:
        return "linear"
    return "sub-linear" if slope >= 0.1 else "flat"


def error_sweep(
    run: Callable[[int], tuple[torch.Tensor, torch.Tensor]], sizes: Sequence[int]
) -> SweepReport:
    """Measure the candidate's error against the reference at each size; fit the slope."""
    if len(sizes) < 2 or len(set(sizes)) < 2:
        raise UserError("a size sweep needs at least two different sizes")
    if any(s <= 0 for s in sizes):
        raise UserError("sizes must be positive")
    points = []
    for size in sizes:
        candidate, reference = run(size)
        d = tensor_diff(reference, candidate, rtol=0.0, atol=0.0)
        points.append(
            SweepPoint(
                size=size, max_abs=d.max_abs, rmse=d.rmse, rel_rms=d.rel_rms, rel_diff=d.rel_diff
            )
        )
    sizes_ = [p.size for p in points]
    slope = loglog_slope(sizes_, [p.max_abs for p in points])
    rel_slope = loglog_slope(sizes_, [p.rel_rms for p in points])
    return SweepReport(
        points=points,
        slope_max_abs=slope,
        slope_rmse=loglog_slope(sizes_, [p.rmse for p in points]),
        slope_rel_rms=rel_slope,
        growth=_growth(slope),
        rel_growth=_growth(rel_slope),
    )
