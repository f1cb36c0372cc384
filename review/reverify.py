"""Re-verification: a pending proposal's patch measured again against the current target.

reverify(store, proposal_id, reviewer="ana")   # a fresh experiment becomes its evidence
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra_agent.errors import UserError
from infra_agent.experiments import run_experiment, task_fingerprint
from infra_agent.review.queue import (
    ReviewConflict,
    already_decided,
    expected_gain,
    get_proposal,
    risk_policy,
)
from infra_agent.review.risk import RiskPolicy, assess
from infra_agent.review.staleness import changed_patch, resolve_task, stored_patch
from infra_agent.store.base import RunStore
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    ProposalRecord,
    ProposalStatus,
)


def reverify(
    store: RunStore,
    proposal_id: str,
    *,
    reviewer: str,
    sandbox: str = "local",
    params: dict[str, Any] | None = None,
    policy: RiskPolicy | Path | None = None,
) -> ProposalRecord:
    """Run the proposal's patch through a fresh experiment against the current target and attach
    it as the proposal's evidence (risk re-assessed; never auto-approved: a human asked).

    The bytes stored now are what is measured. If they changed since the last experiment (they
    no longer hash to `patch_hash`), the proposal is rebound to them: its patch hash becomes
    theirs (earlier evidence, measured on other bytes, no longer backs it), so a decision made
    on a page showing the old hash is refused."""
    proposal = get_proposal(store, proposal_id)
    if proposal.status != ProposalStatus.PENDING:
        raise already_decided(store, proposal)
    task = resolve_task(proposal)
    if task is None:
        raise UserError(f"task '{proposal.task}' cannot be found; cannot re-verify {proposal.id}")
    patch = stored_patch(store, proposal)
    changed = changed_patch(proposal, patch)
    record = patch.to_record()  # id and files recomputed from the bytes
    experiment: ExperimentRecord = run_experiment(
        task, patch, sandbox=sandbox, params=params, store=store, run_id=proposal.run_id
    )
    if store.get_experiment(experiment.id) is None:
        store.put_experiment(experiment)
    assessment = assess(record, experiment.result, risk_policy(policy))
    note = f"; {changed}, so the proposal now carries {record.id[:12]}" if changed else ""
    with store.transaction():
        current = get_proposal(store, proposal.id)
        if current.status != ProposalStatus.PENDING:
            raise already_decided(store, current)
        if current.patch_hash != proposal.patch_hash:
            raise ReviewConflict(f"proposal {proposal.id} changed while it was re-verified")
        store.put_patch(record)
        if changed:  # evidence measured on other bytes backs nothing here any more
            current.patch_id = current.patch_hash = record.id
            current.experiment_ids = []
        current.experiment_ids = [*current.experiment_ids, experiment.id]
        current.target_fingerprint = experiment.target_fingerprint or task_fingerprint(task)
        current.expected_gain = expected_gain(experiment.result)
        current.risk, current.risk_reasons = assessment.level, assessment.reasons
        store.put_proposal(current)
        store.add_decision(
            DecisionRecord(
                proposal_id=current.id,
                reviewer=reviewer,
                action=DecisionAction.REVERIFY,
                patch_hash=current.patch_hash,
                comment=f"experiment {experiment.id}: {experiment.result.verdict.value}{note}",
            )
        )
    return get_proposal(store, proposal.id)
