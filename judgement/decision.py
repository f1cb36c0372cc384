"""The decision rule: one `Comparison` (and, for paired samples, its per-pair ratios) under a
`Rule` gives one `Decision`.

IMPROVED only if the improvement factor exceeds 1 + min_effect, the interval's low end exceeds
1 + min_effect/2 (confident of at least half the minimum effect, not merely of some change: two
worker processes running the same code differ by a percent or two, which a 95% interval alone
would call a change in one A/A experiment of ten on a loaded machine) and the sign test's
interval of per-pair ratios excludes 1.0 (where it applies: per-pair ratios given, at least 6
pairs); REGRESSED symmetrically; NO_CHANGE otherwise. A rate metric is judged on pooled counts
instead (`judgement.rates.decide_counts`). Either way a noisy measurement is flagged `noisy`, and
a gain above the task's plausibility bound `suspicious` (`caveats`).

The microbenchmark's verdict is a view of the same rule at a minimum effect of 0 (`BENCH_RULE`,
no sign test): `Decision.word` is SAME when the whole interval lies inside the equivalence band
[1/(1+e), 1+e] (e: the comparison's `equivalence`), FASTER for IMPROVED, SLOWER for REGRESSED,
AMBIGUOUS otherwise or with fewer than `MIN_SAMPLES` samples in an arm.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from infra_agent.judgement.comparison import BenchVerdict, Comparison
from infra_agent.judgement.intervals import sign_interval
from infra_agent.judgement.power import se_of_interval
from infra_agent.store.verdict import SIGN_OVERRULED, Flag, Verdict

Side = Literal["better", "worse"]

MIN_SAMPLES = 3
"""Below this many samples per arm the microbenchmark's word is AMBIGUOUS whatever the interval
says."""
SUSPICIOUS = "suspicious: "
"""How each reason for the `suspicious` flag begins (the review queue quotes them)."""


@dataclass(frozen=True)
class Rule:
    """What a decision asks of a comparison."""

    min_effect: float
    """The task's minimum effect m: IMPROVED needs a gain above 1 + m, the interval above
    1 + m/2."""
    plausible: float | None = None
    """A gain above this is flagged `suspicious` (the task's `plausible_speedup`)."""
    gain: str = "speedup"
    """What the improvement factor is called (speedup, rate ratio, error ratio)."""


BENCH_RULE = Rule(min_effect=0.0)
"""The microbenchmark's rule: any change the interval shows, no sign test."""


@dataclass(frozen=True)
class Decision:
    """What a comparison shows under a rule: the verdict, why, and its flags."""

    verdict: Verdict
    """IMPROVED, REGRESSED or NO_CHANGE."""
    reasons: list[str]
    """The main reason first; words and the numbers only they carry."""
    flags: list[Flag] = field(default_factory=list)
    shown: Side | None = None
    """The side the interval shows beyond half the minimum effect (before the sign test)."""
    equivalent: bool = False
    """The whole interval lies inside the comparison's equivalence band."""
    enough: bool = True
    """At least `MIN_SAMPLES` samples in each arm."""

    @property
    def word(self) -> BenchVerdict:
        """The microbenchmark's word for this decision (module docstring)."""
        if not self.enough:
            return "AMBIGUOUS"
        if self.equivalent:
            return "SAME"
        if self.verdict is Verdict.IMPROVED:
            return "FASTER"
        if self.verdict is Verdict.REGRESSED:
            return "SLOWER"
        return "AMBIGUOUS"


def beyond_min_effect(speedup: float, ci_low: float, ci_high: float, min_effect: float) -> Side | None:  # fmt: skip
    """The minimum-effect half of the rule: "better" when the improvement factor exceeds
    1 + min_effect and the interval's low end 1 + min_effect/2, "worse" symmetrically."""
    margin = 1.0 + min_effect / 2
    if ci_low > margin and speedup > 1.0 + min_effect:
        return "better"
    if ci_high < 1.0 / margin and speedup < 1.0 / (1.0 + min_effect):
        return "worse"
    return None


def sign_overrules(side: Side, ratios: list[float]) -> tuple[float, float] | None:
    """The sign test's 95% interval of per-pair ratios when it does not agree that the change
    is to `side` (it includes 1.0), else None; None also where it cannot reach 95% (fewer than
    6 pairs: the bootstrap decides alone)."""
    sign = sign_interval(ratios)
    if sign is None or (sign[0] > 1.0 if side == "better" else sign[1] < 1.0):
        return None
    return sign


def settled(c: Comparison, rule: Rule, ratios: list[float], se_goal: float) -> bool:
    """Sampling may stop on this comparison: its interval is as precise as asked (the log
    standard error it implies at most `se_goal`, judgement.power) and, where it shows a side,
    the sign test agrees. A resolved interval the sign test would overrule is not an answer
    yet: more pairs settle it (with 6-8 pairs the sign test needs every pair on one side)."""
    side = beyond_min_effect(c.speedup, c.ci_low, c.ci_high, rule.min_effect)
    precise = se_of_interval(c.ci_low, c.ci_high) <= se_goal
    return precise and (side is None or sign_overrules(side, ratios) is None)


def _verdict(c: Comparison, effect: float, shown: Side | None) -> tuple[Verdict, list[str]]:
    sp, lo, hi = c.speedup, c.ci_low, c.ci_high
    margin = 1.0 + effect / 2
    if shown == "better":
        return Verdict.IMPROVED, [
            f"better with confidence: {sp:.3f}x is beyond the task's minimum effect of "
            f"{effect:.0%} ({1 + effect:.3f}x), and the interval's low end {lo:.3f} above "
            f"{margin:.3f} (half the minimum)"
        ]
    if shown == "worse":
        return Verdict.REGRESSED, [
            f"worse with confidence: {sp:.3f}x is beyond the task's minimum effect of "
            f"{effect:.0%} ({1 / (1 + effect):.3f}x), and the interval's high end {hi:.3f} "
            f"below {1 / margin:.3f} (half the minimum)"
        ]
    if lo <= 1.0 <= hi:
        return Verdict.NO_CHANGE, ["within noise: the interval includes 1.0"]
    if sp > 1.0 + effect or sp < 1.0 / (1.0 + effect):
        return Verdict.NO_CHANGE, [
            f"not shown: the interval reaches within half the task's minimum effect of "
            f"{effect:.0%} ({1 / margin:.3f}-{margin:.3f})"
        ]
    return Verdict.NO_CHANGE, [f"effect below the task's minimum of {effect:.0%}"]


def decide(c: Comparison, rule: Rule, ratios: list[float] | None = None) -> Decision:
    """The decision on a comparison (module docstring); `ratios`: the per-pair ratios (> 1
    better) the sign test reads, None for unpaired samples or the microbenchmark's rule."""
    shown = beyond_min_effect(c.speedup, c.ci_low, c.ci_high, rule.min_effect)
    verdict, reasons = _verdict(c, rule.min_effect, shown)
    if shown is not None and ratios is not None:
        # The bootstrap interval of medians can be too narrow when noise is heavy-tailed or
        # drifts (a loaded machine); the sign test's interval holds whatever the noise.
        # It applies where it can reach 95% (6 pairs or more); with fewer the bootstrap decides
        # alone. (Samples are positive: compare_samples refuses others.)
        sign = sign_overrules(shown, ratios)
        if sign is not None:
            verdict = Verdict.NO_CHANGE
            agree = sum(r > 1.0 if shown == "better" else r < 1.0 for r in ratios)
            reasons = [
                f"{SIGN_OVERRULED} 95% interval of per-pair ratios "
                f"({sign[0]:.3f}-{sign[1]:.3f}) includes 1.0: {agree} of {len(ratios)} pairs "
                f"were {shown}, too few at this count (the bootstrap interval trusts the "
                "noise to be steady; the sign test does not)"
            ]
    band = 1.0 + c.equivalence
    decision = Decision(
        verdict,
        reasons,
        shown=shown,
        equivalent=c.ci_low >= 1.0 / band and c.ci_high <= band,
        enough=c.n_baseline >= MIN_SAMPLES and c.n_candidate >= MIN_SAMPLES,
    )
    return caveats(decision, c, rule)


def caveats(decision: Decision, c: Comparison, rule: Rule) -> Decision:
    """`decision` flagged `noisy` when the comparison's arms were (high IQR or drift), and
    `suspicious` when its gain exceeds the rule's plausibility bound, each with its reason."""
    flags, reasons = list(decision.flags), list(decision.reasons)
    if {"high_iqr", "drift"} & set(c.noise):
        flags.append(Flag.NOISY)
        reasons.append(
            "measurement was noisy (the 95% interval already widens for it; re-measured "
            "elsewhere the point estimate may move): " + "; ".join(c.noise_detail)
        )
    if rule.plausible is not None and c.speedup > rule.plausible:
        flags.append(Flag.SUSPICIOUS)
        reasons.append(
            f"{SUSPICIOUS}{rule.gain} {c.speedup:.2f}x is above the task's plausibility bound "
            f"{rule.plausible:g}x: needs a human look"
        )
    return replace(decision, reasons=reasons, flags=flags)
