"""The review queue: proposals waiting for a human, and the decisions taken on them.

A proposal binds a patch (by content hash) to the experiments that back it. A decision names the
patch hash the reviewer looked at; the queue refuses it if that is no longer the proposal's
patch, and refuses an approval whose evidence is stale (measured on another patch, the stored
patch's bytes no longer hash to the patch measured, or the target changed since: its fingerprint
differs) until it has been re-verified. The hash is always recomputed from the stored bytes,
never taken from the id a row was filed under. Decisions are compare-and-
set on the proposal's status inside one transaction with their audit entry (`DecisionRecord`,
append-only), so of two concurrent decisions exactly one lands and the other is told who won.

    submit_proposal(store, task=..., patch=..., experiment=..., rationale=..., run_id=...)
    decide(store, proposal_id, reviewer="ana", action="approve", patch_hash=...)
    review_outcome(store, proposal_id).render()   # what the agent sees as a tool result
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel

from infra_agent.errors import StoreError, UserError
from infra_agent.experiments import task_fingerprint
from infra_agent.review.risk import PolicyAction, RiskPolicy, assess, load_policy
from infra_agent.review.staleness import staleness
from infra_agent.store.base import RunStore
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    PatchRecord,
    ProposalRecord,
    ProposalStatus,
    RiskLevel,
)
from infra_agent.store.verdict import ExperimentResult
from infra_agent.tasks.manifest import Task

POLICY_REVIEWER = "policy"
"""Reviewer name on decisions the risk policy took by itself."""
MAX_COMMENT_CHARS = 8000
"""Longest reviewer comment (characters): it goes into the agent's conversation."""

_HUMAN_ACTIONS = {
    DecisionAction.APPROVE: ProposalStatus.APPROVED,
    DecisionAction.REJECT: ProposalStatus.REJECTED,
    DecisionAction.REQUEST_CHANGES: ProposalStatus.CHANGES_REQUESTED,
}


class PatchLike(Protocol):
    """What the queue needs of `infra_agent.tasks.patch.Patch`."""

    @property
    def hash(self) -> str: ...

    def to_record(self) -> PatchRecord: ...


class ReviewConflict(UserError):
    """The proposal is no longer pending: someone else decided first."""


class StaleProposal(UserError):
    """The evidence no longer matches the patch or the target: re-verify before approving."""


class ReviewOutcome(BaseModel):
    """The reviewer's answer on a proposal, as the agent reads it after a review interrupt."""

    proposal_id: str
    status: ProposalStatus
    action: DecisionAction | None = None
    """The last human (or policy) decision; None while pending."""
    reviewer: str | None = None
    comment: str = ""
    patch_hash: str

    def render(self) -> str:
        if self.action is None:
            return f"proposal {self.proposal_id}: still pending review"
        head = {
            DecisionAction.APPROVE: "APPROVED",
            DecisionAction.AUTO_APPROVE: "APPROVED by the risk policy",
            DecisionAction.REJECT: "REJECTED",
            DecisionAction.REQUEST_CHANGES: "CHANGES REQUESTED",
            DecisionAction.APPLY: "APPROVED and applied",
            DecisionAction.REVERIFY: "re-verified, still pending",
        }[self.action]
        text = (
            f"proposal {self.proposal_id} (patch {self.patch_hash[:12]}): {head} by {self.reviewer}"
        )
        if self.comment:
            text += f"\nreviewer comment: {self.comment}"
        if self.action == DecisionAction.REQUEST_CHANGES:
            text += "\nRevise the patch, verify it with an experiment, and submit a new proposal."
        return text


# -- submitting ------------------------------------------------------------------------------


def risk_policy(policy: RiskPolicy | Path | None) -> RiskPolicy:
    """The given policy, or the policy file at `policy`, or (None) the bundled default. Callers
    pass the configured `[review] policy`; the queue reads no configuration itself."""
    return policy if isinstance(policy, RiskPolicy) else load_policy(policy)


def expected_gain(result: ExperimentResult) -> float | None:
    """The measured improvement factor (> 1 is better): the speedup, or for a run without a
    performance stage, how much closer to float64 the candidate is (baseline err / candidate err)."""
    perf = result.evidence.performance
    if perf is not None:
        return perf.speedup
    corr = result.evidence.correctness
    if corr is not None and corr.baseline_err_f64 and corr.candidate_err_f64:
        return corr.baseline_err_f64 / corr.candidate_err_f64
    return None


def submit_proposal(
    store: RunStore,
    *,
    task: Task,
    patch: PatchLike | PatchRecord,
    experiment: ExperimentRecord,
    rationale: str,
    run_id: str | None,
    policy: RiskPolicy | Path | None = None,
) -> ProposalRecord:
    """Queue `patch`, backed by `experiment`, for review; return the stored proposal.

    The risk policy sets its risk level and may approve it at once (low risk, IMPROVED, no
    blocking flags) or reject it (a forbidden file); either is audited as a decision by
    'policy'. Earlier proposals of the same run that were sent back, and pending proposals of
    the same task with the same patch, are marked superseded. `policy`: the configured
    `[review] policy` (a loaded policy or its file; None: the bundled default).
    """
    record = patch if isinstance(patch, PatchRecord) else patch.to_record()
    if not isinstance(patch, PatchRecord) and patch.hash != record.id:
        raise UserError(f"patch hash {patch.hash[:12]} does not match its record {record.id[:12]}")
    if experiment.patch_id != record.id:
        raise UserError(
            f"experiment {experiment.id} measured patch {experiment.patch_id[:12]}, "
            f"not the proposed patch {record.id[:12]}"
        )
    assessment = assess(record, experiment.result, risk_policy(policy))
    proposal = ProposalRecord(
        run_id=run_id,
        task=task.name,
        task_root=str(task.root),
        patch_id=record.id,
        patch_hash=record.id,
        experiment_ids=[experiment.id],
        risk=assessment.level,
        risk_reasons=assessment.reasons,
        expected_gain=expected_gain(experiment.result),
        rationale=rationale or record.rationale,
        target_fingerprint=experiment.target_fingerprint or task_fingerprint(task),
    )
    with store.transaction():
        store.put_patch(record)
        if store.get_experiment(experiment.id) is None:
            store.put_experiment(experiment)
        for old in store.proposals():
            revised = (
                run_id is not None
                and old.run_id == run_id
                and old.status == ProposalStatus.CHANGES_REQUESTED
            )
            duplicate = (
                old.task == task.name
                and old.patch_hash == record.id
                and old.status == ProposalStatus.PENDING
            )
            if revised or duplicate:
                store.set_proposal_status(old.id, old.status, ProposalStatus.SUPERSEDED)
        store.put_proposal(proposal)
        if assessment.action != PolicyAction.REVIEW:
            auto = assessment.action == PolicyAction.AUTO_APPROVE
            store.set_proposal_status(
                proposal.id,
                ProposalStatus.PENDING,
                ProposalStatus.APPROVED if auto else ProposalStatus.REJECTED,
            )
            store.add_decision(
                DecisionRecord(
                    proposal_id=proposal.id,
                    reviewer=POLICY_REVIEWER,
                    action=DecisionAction.AUTO_APPROVE if auto else DecisionAction.REJECT,
                    patch_hash=record.id,
                    comment="; ".join(assessment.reasons),
                )
            )
    stored = store.get_proposal(proposal.id)
    assert stored is not None
    return stored


# -- deciding --------------------------------------------------------------------------------


def get_proposal(store: RunStore, proposal_id: str) -> ProposalRecord:
    proposal = store.get_proposal(proposal_id)
    if proposal is None:
        raise UserError(f"proposal '{proposal_id}' not found")
    return proposal


def already_decided(store: RunStore, proposal: ProposalRecord) -> ReviewConflict:
    last = next(
        (d for d in reversed(store.decisions(proposal.id)) if d.action != DecisionAction.REVERIFY),
        None,
    )
    if last is None:
        return ReviewConflict(f"proposal {proposal.id} is {proposal.status.value}, not pending")
    return ReviewConflict(
        f"proposal {proposal.id} was already decided by {last.reviewer} "
        f"({last.action.value} at {last.created_at:%Y-%m-%d %H:%M:%S} UTC); "
        f"it is now {proposal.status.value}"
    )


def decide(
    store: RunStore,
    proposal_id: str,
    *,
    reviewer: str,
    action: DecisionAction | str,
    patch_hash: str,
    comment: str = "",
) -> ProposalRecord:
    """Record a reviewer's decision on the exact patch `patch_hash`; return the updated proposal.

    Raises ReviewConflict if the proposal is no longer pending (naming who decided),
    StaleProposal if `patch_hash` is not the proposal's patch or an approval's evidence is stale,
    UserError for an unknown proposal/action, a forbidden approval or a comment-less request.
    """
    try:
        action = DecisionAction(action.replace("-", "_") if isinstance(action, str) else action)
    except ValueError:
        raise UserError(f"unknown action '{action}' (approve, reject, request_changes)") from None
    if action not in _HUMAN_ACTIONS:
        raise UserError(
            f"action '{action.value}' is not a reviewer decision (approve, reject, request_changes)"
        )
    if not reviewer.strip():
        raise UserError("a decision needs a reviewer name")
    if action == DecisionAction.REQUEST_CHANGES and not comment.strip():
        raise UserError("request-changes needs a comment telling the agent what to change")
    if len(comment) > MAX_COMMENT_CHARS:
        raise UserError(
            f"the comment has {len(comment):,} characters; at most {MAX_COMMENT_CHARS:,} go to "
            "the agent: shorten it"
        )
    proposal = get_proposal(store, proposal_id)
    if proposal.status != ProposalStatus.PENDING:
        raise already_decided(store, proposal)
    if patch_hash != proposal.patch_hash:
        raise StaleProposal(
            f"you reviewed patch {patch_hash[:12]}, but proposal {proposal.id} carries "
            f"{proposal.patch_hash[:12]}; reload it"
        )
    if action == DecisionAction.APPROVE:
        if proposal.risk == RiskLevel.FORBIDDEN:
            raise UserError(
                f"proposal {proposal.id} touches files the risk policy forbids; it cannot be approved"
            )
        reason = staleness(store, proposal)
        if reason is not None:
            raise StaleProposal(f"cannot approve {proposal.id}: {reason}")
    with store.transaction():
        if not store.set_proposal_status(
            proposal.id, ProposalStatus.PENDING, _HUMAN_ACTIONS[action]
        ):
            raise already_decided(store, get_proposal(store, proposal.id))
        store.add_decision(
            DecisionRecord(
                proposal_id=proposal.id,
                reviewer=reviewer,
                action=action,
                patch_hash=patch_hash,
                comment=comment,
            )
        )
    return get_proposal(store, proposal.id)


def review_outcome(store: RunStore, proposal_id: str) -> ReviewOutcome:
    """The latest decision on a proposal, for the agent's tool result."""
    proposal = get_proposal(store, proposal_id)
    last = next(
        (d for d in reversed(store.decisions(proposal.id)) if d.action != DecisionAction.REVERIFY),
        None,
    )
    if last is None or proposal.status == ProposalStatus.PENDING:
        return ReviewOutcome(
            proposal_id=proposal.id, status=proposal.status, patch_hash=proposal.patch_hash
        )
    return ReviewOutcome(
        proposal_id=proposal.id,
        status=proposal.status,
        action=last.action,
        reviewer=last.reviewer,
        comment=last.comment,
        patch_hash=last.patch_hash,
    )


@dataclass
class Queue:
    """The proposals of a queue listing, and the rows the store could not read."""

    proposals: list[ProposalRecord]
    unreadable: list[str] = field(default_factory=list)
    """Ids of proposal rows whose stored body does not parse (shown, never hidden)."""


def read_proposals(store: RunStore, status: ProposalStatus | None = None) -> Queue:
    """Every proposal (with this status) one row at a time, oldest first: a row that cannot be
    read is named in `unreadable` and the others are still returned."""
    queue = Queue(proposals=[])
    for proposal_id in store.proposal_ids(status=status):
        try:
            proposal = store.get_proposal(proposal_id)
        except StoreError:
            queue.unreadable.append(proposal_id)
            continue
        if proposal is not None:
            queue.proposals.append(proposal)
    return queue


def list_queue(
    store: RunStore,
    *,
    status: ProposalStatus | None = None,
    task: str | None = None,
    risk: RiskLevel | None = None,
) -> Queue:
    """Proposals matching the filters, largest proven gain first (the low end of the latest
    experiment's confidence interval: a noisy 16x whose CI starts at 2.8 ranks as 2.8; without a
    performance stage, the expected gain; unmeasured last), and the unreadable rows of `status`."""
    queue = read_proposals(store, status)
    found = [
        p
        for p in queue.proposals
        if (task is None or p.task == task) and (risk is None or p.risk == risk)
    ]
    gains = {p.id: proven_gain(store, p) for p in found}
    found.sort(key=lambda p: (gains[p.id] is None, -(gains[p.id] or 0.0), p.created_at))
    return Queue(proposals=found, unreadable=queue.unreadable)


def proven_gain(store: RunStore, proposal: ProposalRecord) -> float | None:
    """What the latest experiment proves: its speedup CI's low end, else the expected gain."""
    try:
        latest = (
            store.get_experiment(proposal.experiment_ids[-1]) if proposal.experiment_ids else None
        )
    except UserError:  # an unreadable record (StoreError) ranks by what the proposal says
        latest = None
    perf = latest.result.evidence.performance if latest is not None else None
    return perf.ci_low if perf is not None else proposal.expected_gain
