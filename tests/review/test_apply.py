"""After a decision: patches land on a git branch or the argument file; waiting runs resume."""

from __future__ import annotations

import pytest
import tomllib

from infra_agent.errors import UserError
from infra_agent.review.apply import apply_approved
from infra_agent.review.queue import decide, submit_proposal
from infra_agent.store.records import DecisionAction, ProposalStatus


def _approved(store, task, kit, patch=None, run_id=None):
    patch = patch or kit.diff_patch()
    proposal = submit_proposal(
        store,
        task=task,
        patch=patch,
        experiment=kit.experiment_for(task, patch),
        rationale="Slice the queue",
        run_id=run_id,
    )
    if proposal.status == ProposalStatus.PENDING:
        proposal = decide(
            store, proposal.id, reviewer="ana", action="approve", patch_hash=proposal.patch_hash
        )
    return proposal


def test_diff_lands_on_branch_of_workspace_copy(store, task, kit, tmp_path) -> None:
    proposal = _approved(store, task, kit)
    done = apply_approved(store, proposal.id, reviewer="ana", data_dir=tmp_path / "data")
    assert done.status == ProposalStatus.APPLIED
    repo = tmp_path / "data" / "workspaces" / task.name
    branch = f"infra-agent/{proposal.id}"
    assert "return list(queue[:max_batch])" in kit.git(repo, "show", f"{branch}:scheduler.py")
    # The copy's checkout stays the baseline.
    assert "batch.append(request)" in (repo / "scheduler.py").read_text()
    assert store.decisions(proposal.id)[-1].action == DecisionAction.APPLY
    assert branch in done.applied_to


def test_user_repo_checkout_is_untouched_and_branch_not_overwritten(
    store, task, kit, tmp_path
) -> None:
    repo = tmp_path / "user-repo"
    repo.mkdir()
    kit.git(repo, "init", "-q", "-b", "main")
    (repo / "scheduler.py").write_text((task.workspace / "scheduler.py").read_text())
    kit.git(repo, "add", "-A")
    kit.git(repo, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-q", "-m", "init")
    proposal = _approved(store, task, kit)
    apply_approved(store, proposal.id, reviewer="ana", repo=repo)
    assert kit.git(repo, "status", "--porcelain") == ""
    assert kit.git(repo, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    log = kit.git(repo, "log", "--format=%s", f"infra-agent/{proposal.id}")
    assert log.splitlines()[0] == "Slice the queue"


def test_patch_that_no_longer_applies_leaves_proposal_approved(store, task, kit, tmp_path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    kit.git(repo, "init", "-q")
    (repo / "scheduler.py").write_text("different\n")
    kit.git(repo, "add", "-A")
    kit.git(repo, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-q", "-m", "init")
    proposal = _approved(store, task, kit)
    with pytest.raises(UserError, match="not the baseline the experiment measured"):
        apply_approved(store, proposal.id, reviewer="ana", repo=repo)
    assert store.get_proposal(proposal.id).status == ProposalStatus.APPROVED


def test_knobs_merge_into_argument_file(store, task, kit, tmp_path) -> None:
    args = tmp_path / "server_args.toml"
    args.write_text('[server_args]\ndevice = "cpu"\nmax_batch = 4\n')
    proposal = _approved(store, task, kit, patch=kit.knob_patch_record({"max_batch": 32}))
    assert proposal.status == ProposalStatus.APPROVED  # auto-approved by the default policy
    apply_approved(store, proposal.id, reviewer="policy", args_file=args)
    assert tomllib.loads(args.read_text()) == {"server_args": {"device": "cpu", "max_batch": 32}}


def test_a_waiting_run_resumes_through_the_resumer_the_caller_gives(
    store, task, kit, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Review does not import the agent: the caller (the CLI) hands it the resumer; without one
    the proposal says the run still waits and how to resume it."""
    from pathlib import Path

    from infra_agent.review.apply import after_decision
    from infra_agent.store.records import RunRecord, RunStatus

    run = RunRecord(
        task=task.name, objective="latency", policy="llm", status=RunStatus.WAITING_REVIEW
    )
    store.put_run(run)
    proposal = _approved(store, task, kit, run_id=run.id)
    calls: list[tuple[Path, str]] = []

    def resume(path: Path, run_id: str) -> None:
        calls.append((path, run_id))
        waiting = store.get_run(run_id)
        waiting.status = RunStatus.FINISHED
        store.put_run(waiting)

    done = after_decision(store, tmp_path / "runs.db", proposal.id, reviewer="ana")
    assert (
        done.resumption
        == f"pending: no agent runner here; resume with: infra-agent optimize --resume {run.id}"
    )
    done = after_decision(store, tmp_path / "runs.db", proposal.id, reviewer="ana", resume=resume)
    assert (
        calls == [(tmp_path / "runs.db", run.id)]
        and done.resumption == "resumed (run now finished)"
    )


def test_the_cli_wires_the_agents_resumer_into_review() -> None:
    from typer.testing import CliRunner

    from infra_agent.cli import _resume_after_review, app
    from infra_agent.cli.context import current

    CliRunner().invoke(app, ["config", "show", "--json"])
    assert current().resume_run is _resume_after_review


def test_concurrent_applies_one_lands_and_the_others_are_told_plainly(
    store, task, kit, tmp_path
) -> None:
    import threading

    proposal = _approved(store, task, kit)
    data = tmp_path / "data"
    start = threading.Barrier(4)
    outcomes: list[str] = []

    def apply() -> None:
        start.wait()
        try:
            apply_approved(store, proposal.id, reviewer="ana", data_dir=data)
        except UserError as exc:
            outcomes.append(str(exc))
        else:
            outcomes.append("applied")

    threads = [threading.Thread(target=apply) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["applied"] + [f"proposal {proposal.id} is already applied"] * 3
    assert [d.action for d in store.decisions(proposal.id)].count(DecisionAction.APPLY) == 1
