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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from infra_agent.store.records import DecisionAction, DecisionRecord, ProposalRecord, ProposalStatus
from infra_agent.store.verdict import ExperimentResult, Flag, Verdict

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
    if perf is not None:
        return _clip01(math.log2(perf.ci_low)) if perf.ci_low > 0 else 0.0
    if corr is not None and corr.baseline_err_f64 and corr.candidate_err_f64 is not None:
        if corr.candidate_err_f64 <= 0:
            return 1.0
        return _clip01(math.log10(corr.baseline_err_f64 / corr.candidate_err_f64))
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
