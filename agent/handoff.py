"""The run's hand-off to a person, after the loop: `submit` sends the best IMPROVED patch to the
review queue; `review` waits for the human (LangGraph `interrupt`): requested changes go back to
the policy, a rejection ends the run (logged with the reviewer's comment); `apply` applies what
was approved. Each node is idempotent: on resume it runs again from its start."""

from __future__ import annotations

from typing import Any

from langgraph.runtime import Runtime
from langgraph.types import interrupt

from infra_agent.agent.configuration import AgentContext, run_context
from infra_agent.agent.state import AgentState, ExperimentOutcome, Message
from infra_agent.errors import UserError
from infra_agent.review.apply import apply_approved
from infra_agent.review.queue import review_outcome, submit_proposal
from infra_agent.store.records import ProposalStatus
from infra_agent.store.verdict import Verdict


def best_improved(state: AgentState) -> ExperimentOutcome | None:
    """The proven winner: IMPROVED with the highest low end of its 95% interval, what is shown
    rather than the point estimate (overlapping wins are not ranked by noise; ties: the
    earliest)."""
    wins = [e for e in state.experiments if e.verdict is Verdict.IMPROVED and e.ci_low is not None]
    return max(wins, key=lambda e: e.ci_low or 0.0) if wins else None


def submit(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Send the best IMPROVED patch to the review queue (once, even across resumes)."""
    ctx, best = run_context(runtime), best_improved(state)
    if best is None:
        ctx.log.harness("nothing to submit: no experiment came out IMPROVED", name="decision")
        return {"phase": "submit"}
    existing = [
        p.id for p in ctx.store.proposals(run_id=state.run_id) if p.patch_hash == best.patch_id
    ]
    if existing:
        return {"phase": "submit", "proposals": [*state.proposals, *(i for i in existing if i not in state.proposals)]}  # fmt: skip
    record = ctx.store.get_experiment(best.experiment_id)
    assert record is not None
    ctx.on_event("submitting to the review queue")
    patch = ctx.tool_context.patch(best.patch_id)
    proposal = submit_proposal(
        ctx.store, task=ctx.task, patch=patch, experiment=record,
        rationale=state.finish_summary or patch.rationale, run_id=state.run_id,
        policy=ctx.review_policy,
    )  # fmt: skip
    ctx.log.harness(
        f"proposal {proposal.id} submitted: patch {best.patch_id[:12]} ({best.patch_summary}), "
        f"{best.speedup:.3f}x, risk {proposal.risk.value}, status {proposal.status.value}",
        name="proposal",
    )
    return {"phase": "submit", "proposals": [*state.proposals, proposal.id]}


def review(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Wait (interrupt) while a proposal is pending; the decision is read from the store."""
    ctx = run_context(runtime)

    def statuses() -> dict[str, ProposalStatus]:
        found = {pid: ctx.store.get_proposal(pid) for pid in state.proposals}
        return {pid: p.status for pid, p in found.items() if p is not None}

    current = statuses()
    while waiting := [p for p, s in current.items() if s is ProposalStatus.PENDING]:
        # Idempotent up to here: on resume this node runs again from its start.
        interrupt({"run_id": state.run_id, "waiting_for": waiting})
        current = statuses()
    update: dict[str, Any] = {"phase": "review", "review": current}
    for pid, status in current.items():
        if state.review.get(pid) == status:
            continue
        told = review_outcome(ctx.store, pid)
        revise = status is ProposalStatus.CHANGES_REQUESTED and state.revisions < ctx.config.max_revisions  # fmt: skip
        ends = ""
        if status is ProposalStatus.CHANGES_REQUESTED and not revise:
            ends = f"; not sent back: the run has used its {ctx.config.max_revisions} revision(s)"
        by = f" by {told.reviewer}" if told.reviewer else ""
        said = f": {told.comment}" if told.comment else ""
        ctx.log.harness(f"review: proposal {pid} is {status.value}{by}{said}{ends}", name="review")
        if revise:
            note = Message(role="user", content="Reviewer feedback:\n" + told.render())
            ctx.log.message(note)
            update |= {"messages": [*state.messages, note], "revisions": state.revisions + 1,
                       "stop_reason": None, "finish_summary": "", "last_turn": False}  # fmt: skip
    return update


def apply(state: AgentState, runtime: Runtime[AgentContext]) -> dict[str, Any]:
    """Apply every approved proposal of this run."""
    ctx, applied = run_context(runtime), dict(state.applied)
    for pid, status in state.review.items():
        if pid in applied or status not in (ProposalStatus.APPROVED, ProposalStatus.APPLIED):
            continue
        proposal = ctx.store.get_proposal(pid)
        if proposal is not None and proposal.status is ProposalStatus.APPROVED:
            ctx.on_event(f"applying {pid}")
            try:
                proposal = apply_approved(ctx.store, pid, reviewer=f"infra-agent run {state.run_id}")  # fmt: skip
            except UserError as exc:  # e.g. the stored patch was edited after approval
                ctx.log.harness(f"proposal {pid} not applied", error=str(exc), name="apply")
                continue
        applied[pid] = where = proposal.applied_to if proposal is not None else "?"
        ctx.log.harness(f"applied proposal {pid}: {where}", name="apply")
    return {"phase": "done", "applied": applied}
