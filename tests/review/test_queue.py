"""The queue API: risk on submission, decisions bound to the patch hash, staleness, races."""

from __future__ import annotations

import threading

import pytest

from infra_agent.errors import UserError
from infra_agent.review.queue import (
    ReviewConflict,
    StaleProposal,
    decide,
    list_queue,
    review_outcome,
    submit_proposal,
)
from infra_agent.store.records import DecisionAction, ProposalStatus, RiskLevel
from infra_agent.store.verdict import Flag


def _submit(store, task, kit, **kw):
    patch = kit.diff_patch()
    exp = kit.experiment_for(task, patch, **kw)
    return submit_proposal(
        store, task=task, patch=patch, experiment=exp, rationale="faster", run_id=None
    )


def test_source_patch_waits_for_review_and_approval_is_audited(store, task, kit) -> None:
    proposal = _submit(store, task, kit)
    assert proposal.status == ProposalStatus.PENDING
    assert proposal.risk == RiskLevel.MEDIUM
    assert proposal.expected_gain == pytest.approx(1.3)
    done = decide(
        store,
        proposal.id,
        reviewer="ana",
        action="approve",
        patch_hash=proposal.patch_hash,
        comment="ok",
    )
    assert done.status == ProposalStatus.APPROVED
    [decision] = store.decisions(proposal.id)
    assert (decision.reviewer, decision.action, decision.patch_hash, decision.comment) == (
        "ana", DecisionAction.APPROVE, proposal.patch_hash, "ok",
    )  # fmt: skip
    assert "APPROVED by ana" in review_outcome(store, proposal.id).render()


def test_second_decision_is_told_who_won(store, task, kit) -> None:
    proposal = _submit(store, task, kit)
    decide(store, proposal.id, reviewer="ana", action="reject", patch_hash=proposal.patch_hash)
    with pytest.raises(ReviewConflict, match="already decided by ana"):
        decide(store, proposal.id, reviewer="bo", action="approve", patch_hash=proposal.patch_hash)
    assert len(store.decisions(proposal.id)) == 1


def test_concurrent_decisions_one_wins(store, task, kit, tmp_path) -> None:
    from infra_agent.store import open_store

    proposal = _submit(store, task, kit)
    outcomes: dict[str, str] = {}
    barrier = threading.Barrier(4)

    def go(name: str, action: str) -> None:
        own = open_store(tmp_path / "runs.db")
        barrier.wait()
        try:
            decide(
                own,
                proposal.id,
                reviewer=name,
                action=action,
                patch_hash=proposal.patch_hash,
                comment="x",
            )
            outcomes[name] = "won"
        except ReviewConflict as exc:
            outcomes[name] = str(exc)

    threads = [
        threading.Thread(target=go, args=(f"r{i}", a))
        for i, a in enumerate(["approve", "reject", "request_changes", "approve"])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [n for n, o in outcomes.items() if o == "won"]
    assert len(winners) == 1
    assert all(
        f"already decided by {winners[0]}" in o for n, o in outcomes.items() if n not in winners
    )
    assert [d.reviewer for d in store.decisions(proposal.id)] == winners


def test_decision_on_another_patch_hash_is_refused(store, task, kit) -> None:
    proposal = _submit(store, task, kit)
    with pytest.raises(StaleProposal, match="reload"):
        decide(store, proposal.id, reviewer="ana", action="approve", patch_hash="0" * 64)
    assert store.get_proposal(proposal.id).status == ProposalStatus.PENDING
    assert store.decisions(proposal.id) == []


def test_target_change_makes_approval_stale(store, task, kit) -> None:
    proposal = _submit(store, task, kit)
    (task.workspace / "scheduler.py").write_text(
        "# changed upstream\n" + (task.workspace / "scheduler.py").read_text()
    )
    with pytest.raises(StaleProposal, match="target changed"):
        decide(store, proposal.id, reviewer="ana", action="approve", patch_hash=proposal.patch_hash)
    # Rejecting stale evidence stays possible.
    assert (
        decide(
            store, proposal.id, reviewer="ana", action="reject", patch_hash=proposal.patch_hash
        ).status
        == ProposalStatus.REJECTED
    )


def test_request_changes_needs_comment_and_reaches_agent(store, task, kit) -> None:
    proposal = _submit(store, task, kit)
    with pytest.raises(UserError, match="comment"):
        decide(
            store,
            proposal.id,
            reviewer="ana",
            action="request_changes",
            patch_hash=proposal.patch_hash,
        )
    decide(
        store,
        proposal.id,
        reviewer="ana",
        action="request_changes",
        patch_hash=proposal.patch_hash,
        comment="keep the loop for lists",
    )
    outcome = review_outcome(store, proposal.id)
    assert outcome.status == ProposalStatus.CHANGES_REQUESTED
    assert "keep the loop for lists" in outcome.render()


def test_suspicious_flag_raises_risk_and_queue_sorts_by_gain(store, task, kit) -> None:
    a = _submit(store, task, kit, speedup=1.1)
    b = _submit(store, task, kit, speedup=2.5, flags=[Flag.SUSPICIOUS])
    assert store.get_proposal(a.id).status == ProposalStatus.SUPERSEDED  # same patch resubmitted
    assert b.risk == RiskLevel.HIGH
    assert any("suspicious" in r for r in b.risk_reasons)
    assert [p.id for p in list_queue(store).proposals] == [b.id, a.id]
    assert [p.id for p in list_queue(store, status=ProposalStatus.PENDING).proposals] == [b.id]


def test_experiment_must_measure_the_proposed_patch(store, task, kit) -> None:
    patch = kit.diff_patch()
    other = kit.diff_patch(kit.SCHED_DIFF.replace("Slicing", "Slices"))
    with pytest.raises(UserError, match="not the proposed patch"):
        submit_proposal(
            store,
            task=task,
            patch=patch,
            experiment=kit.experiment_for(task, other),
            rationale="",
            run_id=None,
        )
    assert store.proposals() == []
