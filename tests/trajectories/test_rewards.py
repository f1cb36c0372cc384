"""Reward components from verdicts and review decisions, and reweighting."""

from __future__ import annotations

import math

import pytest

from infra_agent.store.records import DecisionAction, DecisionRecord, ProposalRecord, ProposalStatus
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)
from infra_agent.trajectories.rewards import (
    COMPONENTS,
    RewardWeights,
    candidate_components,
    parse_weights,
    proposal_reward,
    reweight,
    trajectory_reward,
)


def _result(verdict: Verdict, *, lo: float = 1.0, flags: list[Flag] | None = None, passed: bool | None = None) -> ExperimentResult:  # fmt: skip
    perf = PerformanceEvidence(
        metric="latency_ms", unit="ms", higher_is_better=False, baseline_median=2.0,
        candidate_median=1.0, speedup=max(lo, 1.0) * 1.05, ci_low=lo, ci_high=lo * 1.1, n_samples=10,
    )  # fmt: skip
    corr = None if passed is None else CorrectnessEvidence(passed=passed, checks=4)
    return ExperimentResult(
        task="t", patch_id="p", verdict=verdict, reasons=["r"], flags=flags or [],
        evidence=Evidence(performance=perf, correctness=corr),
    )  # fmt: skip


def test_proven_improvement_uses_the_lower_confidence_bound() -> None:
    assert candidate_components(
        _result(Verdict.IMPROVED, lo=1.5)
    ).proven_improvement == pytest.approx(math.log2(1.5))
    assert (
        candidate_components(_result(Verdict.IMPROVED, lo=3.0)).proven_improvement == 1.0
    )  # clipped
    # Same point estimate region, but a CI reaching down to 1.02 proves much less.
    assert candidate_components(_result(Verdict.IMPROVED, lo=1.02)).proven_improvement < 0.03
    assert candidate_components(_result(Verdict.NO_CHANGE, lo=1.5)).proven_improvement == 0.0


def test_accuracy_improvement_without_a_speedup() -> None:
    result = ExperimentResult(
        task="t", patch_id="p", verdict=Verdict.IMPROVED, reasons=[],
        evidence=Evidence(correctness=CorrectnessEvidence(passed=True, baseline_err_f64=1e-3, candidate_err_f64=1e-4)),
    )  # fmt: skip
    assert candidate_components(result).proven_improvement == pytest.approx(1.0)


def test_penalties_for_rejected_suspicious_incorrect_regressed_failed() -> None:
    c = candidate_components(_result(Verdict.REJECTED))
    assert (c.rule_violation, c.suspicious, c.correctness) == (-1.0, 0.0, 0.0)
    c = candidate_components(
        _result(Verdict.IMPROVED, lo=2.0, flags=[Flag.SUSPICIOUS], passed=True)
    )
    assert (c.suspicious, c.correctness) == (-1.0, 1.0)
    assert candidate_components(_result(Verdict.INCORRECT, passed=False)).correctness == -1.0
    assert candidate_components(_result(Verdict.REGRESSED)).regression == -1.0
    assert candidate_components(_result(Verdict.FAILED)).failure == -1.0
    assert (
        candidate_components(_result(Verdict.IMPROVED, flags=[Flag.HEALTH_WARNING])).health == -1.0
    )


def test_suspicious_win_is_not_a_proven_win_for_the_trajectory() -> None:
    clean = _result(Verdict.IMPROVED, lo=1.5, passed=True)
    cheat = _result(Verdict.IMPROVED, lo=30.0, flags=[Flag.SUSPICIOUS], passed=True)
    reward = trajectory_reward([clean, cheat], review_scores=[])
    assert reward.components.proven_improvement == pytest.approx(math.log2(1.5))
    assert reward.components.suspicious == -1.0
    assert reward.total < trajectory_reward([clean], review_scores=[]).total


def test_review_decision_binds_to_the_exact_patch() -> None:
    proposal = ProposalRecord(
        task="t", patch_id="p", patch_hash="h2", status=ProposalStatus.PENDING
    )
    stale = DecisionRecord(
        proposal_id=proposal.id, reviewer="a", action=DecisionAction.APPROVE, patch_hash="h1"
    )
    reject = DecisionRecord(
        proposal_id=proposal.id, reviewer="a", action=DecisionAction.REJECT, patch_hash="h2"
    )
    assert (
        proposal_reward(None, proposal, [stale]).components.review == 0.0
    )  # approval was for another hash
    assert proposal_reward(None, proposal, [stale, reject]).components.review == -1.0
    auto = DecisionRecord(proposal_id=proposal.id, reviewer="policy", action=DecisionAction.AUTO_APPROVE, patch_hash="h2")  # fmt: skip
    assert proposal_reward(None, proposal, [auto]).components.review == 0.5


def test_total_is_the_weighted_sum_and_reweighting_is_consistent() -> None:
    results = [_result(Verdict.IMPROVED, lo=1.4, passed=True), _result(Verdict.REJECTED)]
    reward = trajectory_reward(results, review_scores=[1.0])
    c, w = reward.components.model_dump(), reward.weights.model_dump()
    assert reward.total == pytest.approx(sum(c[k] * w[k] for k in COMPONENTS))
    only_improvement = {k: 0.0 for k in COMPONENTS} | {"proven_improvement": 1.0}
    assert reweight(reward, only_improvement) == pytest.approx(math.log2(1.4))
    heavier = trajectory_reward(results, [1.0], parse_weights(["rule_violation=10"]))
    assert heavier.total == pytest.approx(reward.total - 8.0)


@pytest.mark.parametrize("bad", ["nonsense=1", "review", "review=abc", "review=inf"])
def test_parse_weights_rejects_bad_pairs(bad: str) -> None:
    with pytest.raises(ValueError, match="reward weight"):
        parse_weights([bad])


def test_default_weights_round_trip() -> None:
    assert parse_weights([]) == RewardWeights()
