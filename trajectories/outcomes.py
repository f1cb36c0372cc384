"""What a run produced, for its trajectory: the best proven candidate, each patch with the
experiments that measured it, and each proposal with its decisions and reward."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from infra_agent.store.records import ExperimentRecord, ProposalRecord
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.trajectories.atif import (
    Decision,
    PatchExperiment,
    PatchOutcome,
    ProposalOutcome,
)
from infra_agent.trajectories.rewards import (
    COMPONENTS,
    Components,
    RewardWeights,
    combine,
    correctness,
    proven_improvement,
)

if TYPE_CHECKING:
    from infra_agent.trajectories.build import RunBundle


def best_candidate(experiments: list[ExperimentRecord]) -> dict[str, Any]:
    """The best proven candidate (IMPROVED, not suspicious: the largest proven improvement, then
    the largest speedup) and the run's accuracy outcome, as `Outcome` fields."""
    candidates = [
        e
        for e in experiments
        if e.result.verdict is Verdict.IMPROVED and Flag.SUSPICIOUS not in e.result.flags
    ]

    def key(e: ExperimentRecord) -> tuple[float, float]:
        perf = e.result.evidence.performance
        return (proven_improvement(e.result), perf.speedup if perf else 0.0)

    best = max(candidates, key=key, default=None)
    perf = best.result.evidence.performance if best else None
    checked = [correctness(e.result) for e in ([best] if best else experiments)]
    accuracy = (
        "failed"
        if any(s < 0 for s in checked)
        else "passed"
        if any(s > 0 for s in checked)
        else "not_measured"
    )
    return {
        "best_speedup": perf.speedup if perf else None,
        "best_speedup_ci_low": perf.ci_low if perf else None,
        "best_speedup_ci_high": perf.ci_high if perf else None,
        "best_patch_id": best.patch_id if best else None,
        "accuracy_outcome": accuracy,
    }


def patch_outcome(
    bundle: RunBundle, patch_id: str, scores: dict[str, dict[str, float]]
) -> PatchOutcome:
    """A patch with every experiment that measured it and each experiment's reward components."""
    patch = bundle.patches.get(patch_id)
    return PatchOutcome(
        patch_id=patch_id,
        kind=patch.kind if patch else None,
        author=patch.author if patch else "",
        rationale=patch.rationale if patch else "",
        files=list(patch.files) if patch else [],
        diff=patch.diff if patch else "",
        knobs_json=json.dumps(patch.knobs if patch else {}, sort_keys=True, default=str),
        experiments=[
            PatchExperiment(
                experiment_id=e.id,
                verdict=e.result.verdict,
                flags=list(e.result.flags),
                reasons=list(e.result.reasons),
                sandbox=e.sandbox,
                started_at=e.started_at,
                duration_s=e.duration_s,
                target_fingerprint=e.target_fingerprint,
                evidence=e.result.evidence,
                reward_components=Components(**scores[e.id]),
            )
            for e in bundle.experiments
            if e.patch_id == patch_id
        ],
    )


def proposal_outcome(
    bundle: RunBundle,
    p: ProposalRecord,
    review: float,
    scores: dict[str, dict[str, float]],
    weights: RewardWeights,
) -> ProposalOutcome:
    """A proposal with its decisions and its reward: the components of its latest backing
    experiment plus the review."""
    backing = [i for i in p.experiment_ids if i in scores]
    base = scores[backing[-1]] if backing else dict.fromkeys(COMPONENTS, 0.0)
    return ProposalOutcome(
        proposal_id=p.id,
        patch_id=p.patch_id,
        patch_hash=p.patch_hash,
        status=p.status,
        risk=p.risk,
        risk_reasons=list(p.risk_reasons),
        expected_gain=p.expected_gain,
        rationale=p.rationale,
        experiment_ids=list(p.experiment_ids),
        applied_to=p.applied_to,
        decisions=[
            Decision(
                decision_id=d.id,
                reviewer=d.reviewer,
                action=d.action,
                patch_hash=d.patch_hash,
                comment=d.comment,
                created_at=d.created_at,
            )
            for d in bundle.decisions.get(p.id, [])
        ],
        reward=combine(Components(**(base | {"review": review})), weights),
    )
