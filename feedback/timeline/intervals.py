"""Interval arithmetic on timelines (microseconds), by sorting and sweeping.

`union(intervals)` merges overlapping intervals; `total(intervals)` is the length of their
union; `intersection_length(a, b)` is time(A ∩ B) for two sets of intervals (each merged
first, so nesting or overlap inside one set is counted once); `covered_fractions(a, b)` is, for
each interval of A on its own, the share of it inside B.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the input (empty ones dropped)."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in union(intervals))


def intersection_length(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """time(A ∩ B): two-pointer sweep over the merged intervals of each set."""
    ua, ub = union(a), union(b)
    i = j = 0
    length = 0.0
    while i < len(ua) and j < len(ub):
        start = max(ua[i][0], ub[j][0])
        end = min(ua[i][1], ub[j][1])
        if end > start:
            length += end - start
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return length


def covered_fractions(a: Iterable[Interval], b: Iterable[Interval]) -> list[float]:
    """For each non-empty interval of A, in order, the share of its length inside B's union
    (binary search into the merged B, so linear in the B intervals each one meets)."""
    ub = union(b)
    starts = [start for start, _ in ub]
    shares = []
    for start, end in a:
        if end <= start:
            continue
        j = max(bisect.bisect_right(starts, start) - 1, 0)
        inside = 0.0
        while j < len(ub) and ub[j][0] < end:
            inside += max(0.0, min(end, ub[j][1]) - max(start, ub[j][0]))
            j += 1
        shares.append(inside / (end - start))
    return shares
