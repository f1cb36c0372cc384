"""How small an effect an experiment can see: the noise of a short calibration, the smallest
detectable effect at a sample count, and the sample count a wanted resolution needs.

The verdict rule (`judgement.decision.decide`) calls a candidate IMPROVED when its speedup exceeds 1 + m
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
from dataclasses import dataclass, replace

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
    def of(cls, ratios: list[float], seconds: float, timed: int | None = None) -> Noise:
        """From per-pair speedups (at least 2) and the seconds the last `timed` of them took
        (default: all; an extension timed only its new pairs)."""
        logs = [math.log(r) for r in ratios]
        per_pair = seconds / max(timed if timed is not None else len(ratios), 1)
        return cls(statistics.stdev(logs), len(ratios), per_pair)

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
            return head + f"; it aims to detect {self.wanted - 1:.1%}"
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


def pair_noise(ratios: list[float]) -> float | None:
    """sd of the log per-pair speedups (None with fewer than 2 pairs)."""
    return statistics.stdev(math.log(r) for r in ratios) if len(ratios) >= 2 else None


@dataclass(frozen=True)
class Resolution:
    """What one finished measurement could see: from its interval and its per-pair ratios."""

    seen: float
    """Detectable effect of the interval (80% power)."""
    noise: float | None
    """Per-pair noise over every pair (None with fewer than 2)."""
    wanted: float
    """The detectable effect asked for (inf: none, a rate metric)."""
    min_effect: float
    needed: int | None
    """Pairs the wanted effect needs when it was not resolved, scaled from the interval (None:
    resolved, or no sample count reaches it)."""

    @classmethod
    def of(
        cls, ratios: list[float], ci_low: float, ci_high: float, *, wanted: float, min_effect: float
    ) -> Resolution:
        se = se_of_interval(ci_low, ci_high)
        found = cls(detectable_effect(se, min_effect), pair_noise(ratios), wanted, min_effect, None)
        goal = se_for_effect(wanted, min_effect)
        if found.resolved or goal <= 0:
            return found
        # Scaled from the interval itself (se ~ 1/sqrt(pairs)), so that it agrees with what the
        # interval detects; the per-pair sd overstates it when a few pairs are outliers.
        return replace(
            found, needed=max(len(ratios) + 1, math.ceil(len(ratios) * (se / goal) ** 2))
        )

    @property
    def resolved(self) -> bool:
        """Fine enough to see the effect asked for."""
        return not math.isfinite(self.wanted) or self.seen <= self.wanted * (1 + 1e-9)

    def render(self, *, no_change: bool) -> str:
        """One line: what it detects at which noise, against what was asked; for an unresolved
        NO_CHANGE (underpowered) what it rules out and what would resolve it."""
        said = f"; per-pair noise {self.noise:.1%}" if self.noise is not None else ""
        sees = f"changes of {self.seen - 1:.1%} or more (80% power{said})"
        asked = f"{self.wanted - 1:.1%}"
        if not math.isfinite(self.wanted):
            return f"resolution: this measurement detects {sees}"
        if self.resolved:
            return f"resolution: this measurement detects {sees}; it aims to detect {asked}"
        if not no_change:
            return (
                f"resolution: this measurement detects {sees}; it aims to detect {asked}, "
                "and the effect "
                "was large enough anyway"
            )
        more = (
            f"about {self.needed} samples/arm would: extend this experiment, raise the budget's "
            "max_samples / measure_budget_s, or measure on a quieter machine"
            if self.needed
            else "no sample count can: it is at or below the task's minimum effect of "
            f"{self.min_effect:.0%}"
        )
        return (
            f"underpowered: NO_CHANGE only rules out {sees}; {asked} was asked for, which this "
            f"budget cannot resolve at that noise ({more})"
        )
