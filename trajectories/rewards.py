"""Rewards for trajectories and proposals, built from experiment verdicts and review decisions.

Rewards are small named functions with weights (as in `verifiers`): each component is stored
separately in every export, so a user can reweight without re-running anything:
`total = sum(weight[name] * component[name])`.

Per candidate (one experiment on one patch), each component lies in [-1, 1]:

| component            | value                                                                 |
| -------------------- | --------------------------------------------------------------------- |
| `proven_improvement` | IMPROVED only: log2 of the *lower* end of the speedup's 95% CI, clipped to [0, 1] (a speedup proven to be at least 2x scores 1; a barely-significant one near 0). Size and confidence in one number. Accuracy tasks without a speedup: log10(baseline error / candidate error vs float64), clipped to [0, 1]. |
| `correctness`        | +1 correctness checks passed, -1 INCORRECT or a failed check, 0 not measured |
| `health`             | -1 when the output-health guard fired more than on baseline (`health_warning`), else 0 |
| `rule_violation`     | -1 for REJECTED (patch outside editable files, forbidden construct, escape) |
| `suspicious`         | -1 when flagged `suspicious` (implausible speedup, forced human review) |
| `regression`         | -1 for REGRESSED                                                      |
| `failure`            | -1 for FAILED (crash, timeout, resource limit)                        |
| `review`             | proposals only: +1 approved/applied by a reviewer, +0.5 auto-approved by policy, -0.5 changes requested, -1 rejected, 0 pending/none |

Per proposal: the components of its latest backing experiment plus `review`.
Per trajectory: each component aggregated over the run's experiments (`proven_improvement`:
max over candidates not flagged suspicious; `correctness`, `regression`, `failure`: mean;
`health`, `rule_violation`, `suspicious`: min, so one offence costs the full penalty) and
`review`: mean over the run's proposals (0 when none).

Exports score many experiments at once: `score_results` and `weighted_totals` give the values of
`candidate_scores` and `weighted_total` column-wise (numpy), bit for bit; the scalar functions
stay the definitions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from infra_agent.experiments.verdict import ExperimentResult, Flag, Verdict
from infra_agent.store.records import DecisionAction, DecisionRecord, ProposalRecord, ProposalStatus

REWARD_VERSION = 1
"""Bumped whenever a component's definition or a default weight changes."""

Aggregate = Literal["max", "mean", "min"]


@dataclass(frozen=True)
class RewardFunction:
    """One named reward component: how a candidate scores and how a trajectory aggregates it."""

    name: str
    weight: float
    score: Callable[[ExperimentResult], float]
    aggregate: Aggregate
    doc: str


def _clip01(x: float) -> float:
    return 0.0 if math.isnan(x) else min(1.0, max(0.0, x))


def proven_improvement(result: ExperimentResult) -> float:
    if result.verdict is not Verdict.IMPROVED:
        return 0.0
    perf, corr = result.evidence.performance, result.evidence.correctness
    return improvement(
        perf.ci_low if perf is not None else None,
        corr.baseline_err_f64 if corr is not None else None,
        corr.candidate_err_f64 if corr is not None else None,
        measured=perf is not None,
    )


def improvement(
    ci_low: float | None,
    baseline_err: float | None,
    candidate_err: float | None,
    *,
    measured: bool,
) -> float:
    """`proven_improvement` of an IMPROVED result, from its numbers: whether it has performance
    evidence (`measured`) and that evidence's CI low, and the correctness check's errors vs
    float64 (None where absent)."""
    if measured:
        return _clip01(math.log2(ci_low)) if ci_low > 0 else 0.0  # type: ignore[arg-type,operator]
    if baseline_err and candidate_err is not None:
        if candidate_err <= 0:
            return 1.0
        return _clip01(math.log10(baseline_err / candidate_err))
    return 0.0


def correctness(result: ExperimentResult) -> float:
    corr = result.evidence.correctness
    if result.verdict is Verdict.INCORRECT or (corr is not None and not corr.passed):
        return -1.0
    return 1.0 if corr is not None and corr.passed else 0.0


def health(result: ExperimentResult) -> float:
    return -1.0 if Flag.HEALTH_WARNING in result.flags else 0.0


def rule_violation(result: ExperimentResult) -> float:
    return -1.0 if result.verdict is Verdict.REJECTED else 0.0


def suspicious(result: ExperimentResult) -> float:
    return -1.0 if Flag.SUSPICIOUS in result.flags else 0.0


def regression(result: ExperimentResult) -> float:
    return -1.0 if result.verdict is Verdict.REGRESSED else 0.0


def failure(result: ExperimentResult) -> float:
    return -1.0 if result.verdict is Verdict.FAILED else 0.0


CANDIDATE_REWARDS: tuple[RewardFunction, ...] = (
    RewardFunction("proven_improvement", 1.0, proven_improvement, "max", "log2(CI low of speedup), IMPROVED only"),
    RewardFunction("correctness", 0.5, correctness, "mean", "+1 passed, -1 incorrect"),
    RewardFunction("health", 0.5, health, "min", "-1 output-health warning"),
    RewardFunction("rule_violation", 2.0, rule_violation, "min", "-1 REJECTED"),
    RewardFunction("suspicious", 1.0, suspicious, "min", "-1 flagged suspicious"),
    RewardFunction("regression", 0.25, regression, "mean", "-1 REGRESSED"),
    RewardFunction("failure", 0.1, failure, "mean", "-1 FAILED"),
)  # fmt: skip
REVIEW_WEIGHT = 1.0
REVIEW_SCORES: dict[DecisionAction, float] = {
    DecisionAction.APPROVE: 1.0,
    DecisionAction.APPLY: 1.0,
    DecisionAction.AUTO_APPROVE: 0.5,
    DecisionAction.REQUEST_CHANGES: -0.5,
    DecisionAction.REJECT: -1.0,
}
"""Decision action -> review score. REVERIFY carries no judgement and is skipped."""
_STATUS_SCORES: dict[ProposalStatus, float] = {
    ProposalStatus.APPROVED: 1.0,
    ProposalStatus.APPLIED: 1.0,
    ProposalStatus.CHANGES_REQUESTED: -0.5,
    ProposalStatus.REJECTED: -1.0,
}
COMPONENTS: tuple[str, ...] = (*(f.name for f in CANDIDATE_REWARDS), "review")
DEFAULT_WEIGHTS: dict[str, float] = {f.name: f.weight for f in CANDIDATE_REWARDS} | {
    "review": REVIEW_WEIGHT
}


class Components(BaseModel):
    """One value per reward component (same keys in every row, so Arrow sees one struct type)."""

    proven_improvement: float = 0.0
    correctness: float = 0.0
    health: float = 0.0
    rule_violation: float = 0.0
    suspicious: float = 0.0
    regression: float = 0.0
    failure: float = 0.0
    review: float = 0.0


class RewardWeights(Components):
    """A weight per component; defaults are `DEFAULT_WEIGHTS`."""

    proven_improvement: float = DEFAULT_WEIGHTS["proven_improvement"]
    correctness: float = DEFAULT_WEIGHTS["correctness"]
    health: float = DEFAULT_WEIGHTS["health"]
    rule_violation: float = DEFAULT_WEIGHTS["rule_violation"]
    suspicious: float = DEFAULT_WEIGHTS["suspicious"]
    regression: float = DEFAULT_WEIGHTS["regression"]
    failure: float = DEFAULT_WEIGHTS["failure"]
    review: float = DEFAULT_WEIGHTS["review"]


class Reward(BaseModel):
    """A reward with its parts: `total == sum(weights[k] * components[k])`."""

    version: int = REWARD_VERSION
    total: float
    components: Components
    weights: RewardWeights = Field(default_factory=RewardWeights)


def weighted_total(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """`sum(weights[k] * components[k])` over all components, rounded to 12 decimals."""
    return round(sum(weights[name] * components[name] for name in COMPONENTS), 12)


def weighted_totals(components: np.ndarray, weights: Mapping[str, float]) -> list[float]:
    """`weighted_total` of each row of `components` (columns in `COMPONENTS` order), column-wise:
    the same float operations in the same order, and the same rounding (`round_12`). (A NaN
    total, which finite components and weights never make, may differ in its sign bit.)"""
    total = np.zeros(len(components))
    for k, name in enumerate(COMPONENTS):
        total = total + weights[name] * components[:, k]
    return round_12(total)


def round_12(values: np.ndarray) -> list[float]:
    """`[round(v, 12) for v in values]`, bit for bit, about 5x faster. Python rounds the exact
    binary value to 12 decimals, k / 10**12, and returns the double nearest to that: the same as
    `rint(v * 1e12) / 1e12` (10**12 is exact, the division correctly rounded) whenever the product's
    rounding error cannot move it across a half: |v| < 1000 (so the product is below 2**50) and
    not within 2 ulp of a half. The others (ties, huge, NaN, infinite) are Python's `round`."""
    with np.errstate(over="ignore", invalid="ignore"):  # those are Python's to round
        scaled = values * 1e12
        k = np.rint(scaled)
        near = 0.5 - np.abs(scaled - k) <= 2 * np.spacing(np.abs(scaled))
        odd = ~(np.abs(values) < 1e3) | near
    out: list[float] = (k / 1e12).tolist()
    for i in np.flatnonzero(odd).tolist():
        out[i] = round(float(values[i]), 12)
    return out


def reward_dict(components: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, Any]:
    """`Reward(...).model_dump()` of these components and weights, built without pydantic (exports
    build one per run and per proposal)."""
    return {
        "version": REWARD_VERSION,
        "total": weighted_total(components, weights),
        "components": {name: components[name] for name in COMPONENTS},
        "weights": {name: weights[name] for name in COMPONENTS},
    }


def combine(components: Components, weights: RewardWeights | None = None) -> Reward:
    """Weigh `components` into a `Reward`."""
    weights = weights or RewardWeights()
    total = weighted_total(components.model_dump(), weights.model_dump())
    return Reward(total=total, components=components, weights=weights)


def parse_weights(pairs: Iterable[str]) -> RewardWeights:
    """`['review=2', 'failure=0']` -> weights (others default). Raises ValueError naming the bad pair."""
    values = dict(DEFAULT_WEIGHTS)
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or name not in values:
            raise ValueError(
                f"reward weight '{pair}': expected NAME=NUMBER with NAME one of {', '.join(COMPONENTS)}"
            )
        try:
            values[name] = float(raw)
        except ValueError:
            raise ValueError(f"reward weight '{pair}': '{raw}' is not a number") from None
        if not math.isfinite(values[name]):
            raise ValueError(f"reward weight '{pair}': must be finite")
    return RewardWeights(**values)


def candidate_scores(result: ExperimentResult) -> dict[str, float]:
    """Component name -> value for one experiment, every component (review is 0: an experiment
    alone has no reviewer). Plain floats: exports call this for every experiment."""
    return {f.name: f.score(result) for f in CANDIDATE_REWARDS} | {"review": 0.0}


def candidate_components(result: ExperimentResult) -> Components:
    """The components of one experiment (review is 0: an experiment alone has no reviewer)."""
    return Components(**candidate_scores(result))


def review_score(proposal: ProposalRecord, decisions: Sequence[DecisionRecord]) -> float:
    """The last judgement on the proposal's exact patch; falls back to the proposal's status."""
    for decision in reversed(decisions):
        if decision.patch_hash == proposal.patch_hash and decision.action in REVIEW_SCORES:
            return REVIEW_SCORES[decision.action]
    return _STATUS_SCORES.get(proposal.status, 0.0)


def proposal_reward(
    latest: ExperimentResult | None,
    proposal: ProposalRecord,
    decisions: Sequence[DecisionRecord],
    weights: RewardWeights | None = None,
) -> Reward:
    """Reward of one proposal: its latest backing experiment's components plus the review."""
    return combine(Components(**proposal_scores(latest, proposal, decisions)), weights)


def proposal_scores(
    latest: ExperimentResult | None, proposal: ProposalRecord, decisions: Sequence[DecisionRecord]
) -> dict[str, float]:
    """The components of `proposal_reward`, as plain floats."""
    base = candidate_scores(latest) if latest is not None else dict.fromkeys(COMPONENTS, 0.0)
    return base | {"review": review_score(proposal, decisions)}


def trajectory_reward(
    results: Sequence[ExperimentResult],
    review_scores: Sequence[float],
    weights: RewardWeights | None = None,
) -> Reward:
    """Reward of a whole run from its experiments' results and its proposals' review scores."""
    return combine(Components(**trajectory_scores(results, review_scores)), weights)


def trajectory_scores(
    results: Sequence[ExperimentResult], review_scores: Sequence[float]
) -> dict[str, float]:
    """The components of `trajectory_reward`, as plain floats."""
    candidates = [(candidate_scores(r), Flag.SUSPICIOUS in r.flags) for r in results]
    return aggregate_scores(candidates, review_scores)


def aggregate_scores(
    candidates: Sequence[tuple[Mapping[str, float], bool]], review_scores: Sequence[float]
) -> dict[str, float]:
    """Trajectory components from each experiment's `candidate_scores` and whether it was flagged
    suspicious (a suspicious win is not a proven one), plus the proposals' review scores."""
    values: dict[str, float] = {}
    for fn in CANDIDATE_REWARDS:
        if fn.name == "proven_improvement":
            scores = [c[fn.name] for c, flagged in candidates if not flagged]
        else:
            scores = [c[fn.name] for c, _ in candidates]
        values[fn.name] = _aggregate(fn.aggregate, scores)
    values["review"] = sum(review_scores) / len(review_scores) if review_scores else 0.0
    return values


def _aggregate(how: Aggregate, scores: Sequence[float]) -> float:
    if not scores:
        return 0.0
    if how == "max":
        return max(scores)
    if how == "min":
        return min(scores)
    return sum(scores) / len(scores)


def reweight(reward: Reward, weights: Mapping[str, float] | RewardWeights) -> float:
    """The total `reward` would have under other weights."""
    w = weights if isinstance(weights, RewardWeights) else RewardWeights(**dict(weights))
    return combine(reward.components, w).total


VERDICT_ORDER: tuple[Verdict, ...] = tuple(Verdict)
"""Every verdict in a fixed order: `ScoredResults.verdict` holds indices into it."""
_INDEX = {id(v): k for k, v in enumerate(VERDICT_ORDER)}  # by identity: Enum hashes in Python
_IMPROVED, _REGRESSED, _INCORRECT, _FAILED, _REJECTED = (
    VERDICT_ORDER.index(v)
    for v in (Verdict.IMPROVED, Verdict.REGRESSED, Verdict.INCORRECT, Verdict.FAILED, Verdict.REJECTED)
)  # fmt: skip


@dataclass(frozen=True)
class ScoredResults:
    """Many experiment results as columns, with the `candidate_scores` of each as a matrix row."""

    verdict: np.ndarray
    """Index into `VERDICT_ORDER` (int8), one per result."""
    suspicious: np.ndarray
    """Flagged `suspicious` (bool), one per result."""
    health_warning: np.ndarray
    """Flagged `health_warning` (bool), one per result."""
    checked: np.ndarray
    """The correctness evidence: 1.0 passed, -1.0 failed, 0.0 none (float64), one per result."""
    scores: np.ndarray
    """(results, len(CANDIDATE_REWARDS)) float64: column k holds `CANDIDATE_REWARDS[k]`'s score."""


def score_results(results: Sequence[ExperimentResult]) -> ScoredResults:
    """`candidate_scores` of many results at once, column-wise: the same values, bit for bit
    (tests/trajectories/test_score_results.py). The scalar functions stay the definition: the
    components that are a verdict, a flag or the correctness check are their comparisons over
    arrays (`_COLUMNWISE`), `proven_improvement` is called on the IMPROVED results only (it is 0
    for any other), and a component without a column-wise form is scored result by result."""
    n = len(results)
    verdict = np.array([_INDEX[id(r.verdict)] for r in results], dtype=np.int8)
    suspicious, health_warning = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for i, flags in enumerate([r.flags for r in results]):
        if flags:  # rare: most results carry no flag
            suspicious[i] = Flag.SUSPICIOUS in flags
            health_warning[i] = Flag.HEALTH_WARNING in flags
    corrs = [r.evidence.correctness for r in results]
    checked = np.array(
        [0.0 if c is None else 1.0 if c.passed else -1.0 for c in corrs], dtype=np.float64
    )
    return score_columns(verdict, suspicious, health_warning, checked, results)


def score_columns(
    verdict: np.ndarray,
    suspicious: np.ndarray,
    health_warning: np.ndarray,
    checked: np.ndarray,
    results: Sequence[ExperimentResult],
    proven: np.ndarray | None = None,
) -> ScoredResults:
    """`score_results` of results already given as the columns of `ScoredResults` (`results`
    the same results, in order: read for IMPROVED ones unless `proven` is given, and for a
    component without a column-wise form, so a caller may hand a sequence that builds them on
    demand). `proven`: the `proven_improvement` column, when the caller made it from the
    results' numbers (`improvement` of each IMPROVED one, 0.0 for the others)."""
    n = len(verdict)
    columns = ScoredResults(verdict, suspicious, health_warning, checked, np.empty((n, 0)))
    scores = np.empty((n, len(CANDIDATE_REWARDS)))
    for k, fn in enumerate(CANDIDATE_REWARDS):
        form = _COLUMNWISE.get(fn.score)
        if fn.score is proven_improvement and proven is not None:
            scores[:, k] = proven
        elif form is not None:
            scores[:, k] = form(columns, results)
        else:
            scores[:, k] = [fn.score(r) for r in results]
    return ScoredResults(verdict, suspicious, health_warning, checked, scores)


def _penalty(mask: np.ndarray) -> np.ndarray:
    return np.where(mask, -1.0, 0.0)  # not -mask: that writes -0.0 where the scalar writes 0.0


def _proven_column(c: ScoredResults, results: Sequence[ExperimentResult]) -> np.ndarray:
    out = np.zeros(len(c.verdict))
    improved = np.flatnonzero(c.verdict == _IMPROVED).tolist()
    out[improved] = [proven_improvement(results[i]) for i in improved]
    return out


_COLUMNWISE: dict[
    Callable[[ExperimentResult], float],
    Callable[[ScoredResults, Sequence[ExperimentResult]], np.ndarray],
] = {
    proven_improvement: _proven_column,
    correctness: lambda c, _: np.where(c.verdict == _INCORRECT, -1.0, c.checked),
    health: lambda c, _: _penalty(c.health_warning),
    rule_violation: lambda c, _: _penalty(c.verdict == _REJECTED),
    suspicious: lambda c, _: _penalty(c.suspicious),
    regression: lambda c, _: _penalty(c.verdict == _REGRESSED),
    failure: lambda c, _: _penalty(c.verdict == _FAILED),
}
"""Scalar reward function -> its column-wise form (`score_results`)."""
