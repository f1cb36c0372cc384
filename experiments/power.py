"""How small an effect an experiment can see: the noise of a short calibration, the smallest
detectable effect at a sample count, and the sample count a wanted resolution needs.

The verdict rule (`measure.decide`) calls a candidate IMPROVED when its speedup exceeds 1 + m
(m: the task's `min_effect`), the 95% interval's low end exceeds 1 + m/2, and the sign test
agrees. If the log speedup is estimated with standard error `se`, a true speedup `e` comes out
IMPROVED with probability 80% when

    log e = max(log(1 + m), log(1 + m/2) + 1.96 se) + 0.84 se

and that `e` is the experiment's *detectable effect* (REGRESSED mirrors it). The standard error
is read off a measured interval (`se_of_interval`: its log width over 2 x 1.96) or predicted from
the per-pair noise of a calibration (`Noise`: the spread of log per-pair speedups, se ~ 1.25
sd / sqrt(n) for a median of n pairs). A task asks for the precision `target_ci_width` (a 95%
interval that narrow), which fixes the effect it wants to see; a caller can ask for a finer one
(`detect`); when the budget (`max_samples`, `measure_budget_s`) cannot reach it, the experiment
says so before measuring and in its verdict instead of returning a bare NO_CHANGE.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

Z95 = 1.959964
"""Two-sided 95% normal quantile (the verdict's interval)."""
Z80 = 0.841621
"""One-sided 80% normal quantile (the power a detectable effect is quoted at)."""
MEDIAN_EFFICIENCY = 1.2533
"""sd of a median over sd of a mean for normal noise (sqrt(pi/2))."""


def detectable_effect(se: float, min_effect: float) -> float:
    """Smallest true speedup (> 1) found IMPROVED with 80% probability at log standard error `se`."""
    floor = max(math.log1p(min_effect), math.log1p(min_effect / 2) + Z95 * se)
    return math.exp(floor + Z80 * se)


def se_for_effect(effect: float, min_effect: float) -> float:
    """Largest standard error at which `effect` is still detectable (0.0 if no precision is
    enough: the verdict rule never calls an effect at or below 1 + min_effect IMPROVED reliably)."""
    lo, hi = 0.0, 1.0
    if detectable_effect(0.0, min_effect) >= effect:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if detectable_effect(mid, min_effect) <= effect else (lo, mid)
    return lo


def se_of_interval(low: float, high: float) -> float:
    """Standard error of the log speedup implied by a 95% interval [low, high]."""
    return math.log(high / low) / (2 * Z95)


def se_of_width(width: float) -> float:
    """Standard error implied by a relative 95% interval width (high - low) / speedup, for an
    interval symmetric in log (speedup x exp(-a) .. speedup x exp(a): width = 2 sinh(a))."""
    return math.asinh(width / 2) / Z95


def pairs_for(pair_sd: float, se: float) -> int | None:
    """Pairs with per-pair noise `pair_sd` needed to reach standard error `se` (None: se is 0,
    which no sample count reaches)."""
    if se <= 0:
        return None
    return max(2, math.ceil((MEDIAN_EFFICIENCY * pair_sd / se) ** 2))


@dataclass(frozen=True)
class Noise:
    """Per-pair noise measured by a calibration."""

    pair_sd: float
    """Standard deviation of the log per-pair speedups (about the relative noise of a ratio)."""
    pairs: int
    seconds_per_pair: float
    """Wall time one pair of samples took (both arms)."""

    @classmethod
    def of(cls, ratios: list[float], seconds: float) -> Noise:
        """From per-pair speedups (at least 2) and the seconds they took."""
        logs = [math.log(r) for r in ratios]
        return cls(statistics.stdev(logs), len(ratios), seconds / len(ratios))

    def se(self, pairs: int) -> float:
        """Predicted standard error of the log speedup with `pairs` pairs."""
        return MEDIAN_EFFICIENCY * self.pair_sd / math.sqrt(max(pairs, 1))

    def pairs_for(self, se: float) -> int | None:
        """Pairs needed to reach standard error `se` (None: unreachable, se is 0)."""
        return pairs_for(self.pair_sd, se)

    def render(self) -> str:
        return (
            f"per-pair noise {self.pair_sd:.1%} (sd of log per-pair speedups, {self.pairs} pairs, "
            f"{self.seconds_per_pair:.1f} s a pair)"
        )


@dataclass(frozen=True)
class Plan:
    """What an experiment can resolve, decided after its calibration."""

    noise: Noise
    wanted: float
    """The detectable effect asked for (a speedup, e.g. 1.10)."""
    pairs: int
    """Pairs the experiment will take at most (the budget's cap, fewer if the time budget ends)."""
    needed: int | None
    """Pairs the wanted resolution needs at this noise (None: no sample count reaches it)."""
    reachable: float
    """Detectable effect at `pairs` (what the budget allows at this noise)."""

    @property
    def underpowered(self) -> bool:
        """The budget cannot reach the resolution asked for."""
        return self.needed is None or self.needed > self.pairs

    def render(self) -> str:
        head = (
            f"calibration: {self.noise.render()}; at up to {self.pairs} samples/arm this "
            f"experiment detects a change of {self.reachable - 1:.1%} or more (80% power)"
        )
        if not self.underpowered:
            return head + f"; asked {self.wanted - 1:.1%}"
        if self.needed is None:
            more = "no sample count reaches it (it is at or below the task's minimum effect)"
        else:
            more = (
                f"that needs about {self.needed} samples/arm "
                f"(~{_duration(self.needed * self.noise.seconds_per_pair)} of measuring)"
            )
        return head + f"; asked for {self.wanted - 1:.1%}, finer than this budget allows: {more}"


def plan(
    noise: Noise,
    *,
    wanted: float,
    min_effect: float,
    max_pairs: int,
    seconds_left: float,
    taken: int,
) -> Plan:
    """The plan after calibration: `taken` pairs done, at most `max_pairs`, `seconds_left` of the
    measuring budget for more."""
    affordable = taken + max(0, int(seconds_left // max(noise.seconds_per_pair, 1e-9)))
    pairs = max(taken, min(max_pairs, affordable))
    return Plan(
        noise=noise,
        wanted=wanted,
        pairs=pairs,
        needed=noise.pairs_for(se_for_effect(wanted, min_effect)),
        reachable=detectable_effect(noise.se(pairs), min_effect),
    )


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
