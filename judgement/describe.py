"""Percentiles of a sample (latencies, gaps, lags): descriptive numbers, no interval.

They live here so that every quantile the tree computes has one home beside the intervals
(`tests/test_judgement_core.py` finds any other).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The `q`-th percentile (0-100) of `values`, linearly interpolated (numpy's default)."""
    return float(np.percentile(values, q))


def rank_percentiles(values: Sequence[float], qs: Sequence[int]) -> dict[str, float]:
    """`p<q>` -> the nearest-rank `q`-th percentile (an element of `values`, the one at index
    len * q // 100 of the sorted values); empty for no values."""
    if not values:
        return {}
    ordered = sorted(values)
    return {f"p{q}": ordered[min(len(ordered) - 1, len(ordered) * q // 100)] for q in qs}
