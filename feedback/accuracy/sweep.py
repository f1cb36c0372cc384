"""Error growth with problem size: `error_sweep(run, sizes) -> SweepReport`.

`run(size)` returns `(candidate, reference)` tensors for one problem size (e.g. sequence
length). At each size the candidate's max |error| and RMSE against the reference are measured,
and the slope of log(error) over log(size) is fitted by least squares: slope ≈ 1 means the
error grows linearly with size, > 1 super-linearly ("rounding error accumulates with length"
becomes a number). `growth` names the regime of the max-abs slope: 'super-linear' (> 1.1),
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
    rel_diff: float


class SweepReport(BaseModel):
    points: list[SweepPoint] = Field(default_factory=list)
    slope_max_abs: float
    """d log(max |error|) / d log(size)."""
    slope_rmse: float
    growth: Growth

    def render(self) -> str:
        pts = ", ".join(f"{p.size}: {p.max_abs:.2e}" for p in self.points)
        return (
            f"error growth {self.growth}: log-log slope {self.slope_max_abs:.2f} (max abs), "
            f"{self.slope_rmse:.2f} (rmse)\nmax abs error by size: {pts}"
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
        points.append(SweepPoint(size=size, max_abs=d.max_abs, rmse=d.rmse, rel_diff=d.rel_diff))
    slope = loglog_slope([p.size for p in points], [p.max_abs for p in points])
    return SweepReport(
        points=points,
        slope_max_abs=slope,
        slope_rmse=loglog_slope([p.size for p in points], [p.rmse for p in points]),
        growth=_growth(slope),
    )
