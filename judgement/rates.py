"""Rare-event rates (corrupted requests per 10k): pooled counts, exact intervals, a decision.

A race that corrupts a few requests in ten thousand cannot be judged by comparing per-sample
medians: most samples see no event at all. A rate metric (`[metric] events = ..., trials = ...`
in task.toml) is judged on the counts pooled over every sample of each arm instead:

- each arm's rate and the candidate's exact 95% upper bound (Poisson), which is what "fixed"
  can be shown to: zero events in N trials bound the rate below 3.0/N;
- the improvement factor (baseline rate / candidate rate, > 1 better) with an exact interval from
  the conditional binomial test (given k = kb + kc events, kc is Binomial(k, p) with
  p = nc / (nc + nb * factor)), Clopper-Pearson bounds on p turned into bounds on the factor;
- a sequential stopping rule for the measurement: stop as soon as the interval excludes the
  task's minimum effect either way (and, for an improvement, the candidate's upper bound is below
  the task's `target` rate), so a fix is run until it is shown, a regression no longer than that.

The point estimate adds one half to each count (the factor is finite when the candidate saw none);
an upper end without any candidate event is unbounded and stored as UNBOUNDED.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra_agent.judgement.comparison import Comparison
from infra_agent.judgement.decision import Decision, Side
from infra_agent.judgement.intervals import CONFIDENCE, clopper_pearson, poisson_upper
from infra_agent.store.verdict import UNBOUNDED, Verdict


@dataclass(frozen=True)
class RateComparison:
    """Pooled events and trials of both arms, and what they show."""

    baseline_events: int
    baseline_trials: int
    candidate_events: int
    candidate_trials: int
    per: float
    """Rates are events per this many trials (10,000: per 10k)."""

    @property
    def baseline_rate(self) -> float:
        return self.per * self.baseline_events / max(self.baseline_trials, 1)

    @property
    def candidate_rate(self) -> float:
        return self.per * self.candidate_events / max(self.candidate_trials, 1)

    @property
    def candidate_upper(self) -> float:
        """The candidate's rate, exact 95% upper bound (one-sided), per `per` trials."""
        return self.per * poisson_upper(self.candidate_events) / max(self.candidate_trials, 1)

    @property
    def factor(self) -> float:
        """Baseline rate / candidate rate (> 1: fewer events), each count plus one half."""
        b = (self.baseline_events + 0.5) / max(self.baseline_trials, 1)
        c = (self.candidate_events + 0.5) / max(self.candidate_trials, 1)
        return b / c

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """Exact interval of the factor (conditional binomial test); (0, UNBOUNDED) when
        neither arm saw an event."""
        kb, kc = self.baseline_events, self.candidate_events
        nb, nc = max(self.baseline_trials, 1), max(self.candidate_trials, 1)
        if kb + kc == 0:
            return 0.0, UNBOUNDED
        p_low, p_high = clopper_pearson(kc, kb + kc, confidence)
        low = nc * (1.0 - p_high) / (nb * p_high)
        high = UNBOUNDED if p_low <= 0.0 else min(UNBOUNDED, nc * (1.0 - p_low) / (nb * p_low))
        return low, high

    def render_counts(self) -> str:
        """The pooled counts and rates, without the factor (a verdict states that once)."""
        unit = f"per {self.per:g}" if self.per != 10_000 else "per 10k"
        return (
            f"{self.baseline_events} of {self.baseline_trials} -> {self.candidate_events} of "
            f"{self.candidate_trials} ({self.baseline_rate:.3g} -> {self.candidate_rate:.3g} {unit}; "
            f"candidate below {self.candidate_upper:.3g} {unit} at 95%)"
        )

    def render(self) -> str:
        low, high = self.interval()
        top = "unbounded" if high >= UNBOUNDED else f"{high:.3g}"
        return f"{self.render_counts()}; fewer by {self.factor:.3g}x (95% CI {low:.3g}-{top})"


def pooled(
    baseline: dict[str, list[float]], candidate: dict[str, list[float]], events: str, trials: str,
    per: float,
) -> RateComparison:  # fmt: skip
    """Counts pooled over the samples both arms have (same number per arm)."""
    n = min(len(baseline.get(events, [])), len(candidate.get(events, [])))
    return RateComparison(
        baseline_events=int(sum(baseline[events][:n])),
        baseline_trials=int(sum(baseline[trials][:n])),
        candidate_events=int(sum(candidate[events][:n])),
        candidate_trials=int(sum(candidate[trials][:n])),
        per=per,
    )


def shown(rates: RateComparison, min_effect: float, target: float | None) -> Side | None:
    """'better' when the candidate is shown to have fewer events by more than half the minimum
    effect (and, if the task names a target rate, shown below it), 'worse' when shown to have
    more, None while neither is shown."""
    low, high = rates.interval()
    margin = 1.0 + min_effect / 2
    if low > margin and (target is None or rates.candidate_upper < target):
        return "better"
    if high < 1.0 / margin:
        return "worse"
    return None


def decide_counts(
    rates: RateComparison, min_effect: float, target: float | None, unit: str
) -> Decision:
    """A rate metric's decision: IMPROVED when fewer events are shown (`shown`, and below the
    task's `target` rate in `unit` if it names one), REGRESSED when more are, NO_CHANGE
    otherwise, saying what is not shown yet."""
    outcome = shown(rates, min_effect, target)
    low, _ = rates.interval()
    if outcome == "better":
        return Decision(
            Verdict.IMPROVED,
            [f"fewer events with confidence: {rates.render_counts()}"],
            shown=outcome,
        )
    if outcome == "worse":
        return Decision(
            Verdict.REGRESSED,
            [f"more events with confidence: {rates.render_counts()}"],
            shown=outcome,
        )
    margin = 1.0 + min_effect / 2
    if low > margin and target is not None:
        why = (
            f"fewer events, but not shown below the task's target of {target:g} "
            f"{unit}: the candidate's 95% upper bound is above it (more requests "
            "needed)"
        )
    else:
        why = "the difference is not shown (the interval reaches within half the minimum effect)"
    return Decision(Verdict.NO_CHANGE, [f"{why}: {rates.render_counts()}"])


def as_comparison(rates: RateComparison, n_samples: int, min_effect: float) -> Comparison:
    """The rates in the shape the rest of the cascade reads (oriented > 1 = better)."""
    low, high = rates.interval()
    return Comparison(
        speedup=rates.factor,
        ci_low=low,
        ci_high=high,
        verdict=decide_counts(rates, min_effect, None, "").word,
        n_baseline=n_samples,
        n_candidate=n_samples,
        baseline_median=rates.baseline_rate,
        candidate_median=rates.candidate_rate,
        higher_is_better=False,
        equivalence=min_effect,
        method=(
            "pooled event counts; exact conditional binomial interval of the rate ratio "
            "(Clopper-Pearson); candidate rate bounded by the exact Poisson 95% upper limit"
        ),
    )
