"""Approvals are bound to bytes: a stored patch edited in place (its id kept) is refused by
approval and apply, re-verification measures and rebinds the edited bytes, and the applied
commit is the verified workspace byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.review.apply import apply_approved
from infra_agent.review.queue import StaleProposal, decide, submit_proposal
from infra_agent.review.reverify import reverify
from infra_agent.review.staleness import staleness
from infra_agent.store.records import DecisionAction, ProposalStatus
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.patch import Patch, parse_diff
from infra_agent.tasks.tree import preview_apply

EDITS = {
    "a changed line": lambda d: d.replace("queue[:max_batch]", "queue[: max_batch + 1]"),
    "CRLF line endings": lambda d: d.replace("\n", "\r\n"),
    "an extra line past the hunk's counts": lambda d: d + "+    return []\n",
}


def _submit(store, task, kit, patch=None):
    patch = patch or kit.diff_patch()
    return submit_proposal(
        store, task=task, patch=patch, experiment=kit.experiment_for(task, patch),
        rationale="Slice the queue", run_id=None,
    )  # fmt: skip


def _tree(repo: Path, ref: str, kit) -> dict[str, bytes]:
    import subprocess

    names = kit.git(repo, "ls-tree", "-r", "--name-only", ref).splitlines()
    return {
        n: subprocess.run(
            ["git", "-C", str(repo), "cat-file", "blob", f"{ref}:{n}"],
            capture_output=True,
            check=True,
        ).stdout  # fmt: skip
        for n in names
    }


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS.keys())
def test_a_diff_edited_in_place_is_not_approved(store, task, kit, tmp_path, edit) -> None:
    proposal = _submit(store, task, kit)
    kit.edit_stored_patch(tmp_path / "runs.db", proposal.patch_id, edit)
    reason = staleness(store, proposal)
    assert reason is not None and "changed after it was verified" in reason
    with pytest.raises(StaleProposal, match="hash to"):
        decide(store, proposal.id, reviewer="ana", action="approve", patch_hash=proposal.patch_hash)
    assert store.get_proposal(proposal.id).status == ProposalStatus.PENDING
    assert store.decisions(proposal.id) == []


@pytest.mark.parametrize("edit", EDITS.values(), ids=EDITS.keys())
def test_a_diff_edited_after_approval_is_not_applied(store, task, kit, tmp_path, edit) -> None:
    proposal = _submit(store, task, kit)
    decide(store, proposal.id, reviewer="ana", action="approve", patch_hash=proposal.patch_hash)
    kit.edit_stored_patch(tmp_path / "runs.db", proposal.patch_id, edit)
    with pytest.raises(UserError, match="refusing to apply .* changed after it was verified"):
        apply_approved(store, proposal.id, reviewer="ana", data_dir=tmp_path / "data")
    assert store.get_proposal(proposal.id).status == ProposalStatus.APPROVED
    assert not (tmp_path / "data" / "workspaces").exists()  # nothing was committed anywhere
    assert [d.action for d in store.decisions(proposal.id)] == [DecisionAction.APPROVE]


def test_the_agent_logs_a_patch_edited_after_approval_as_not_applied(
    store, task, kit, tmp_path, monkeypatch
) -> None:
    """The run's apply node records the refusal and finishes instead of crashing the run."""
    from types import SimpleNamespace

    from infra_agent.agent.handoff import apply
    from infra_agent.agent.runlog import RunLog
    from infra_agent.agent.state import AgentState
    from infra_agent.store.records import RunRecord

    monkeypatch.setenv("INFRA_AGENT_HOME", str(tmp_path / "home"))
    run = RunRecord(task=task.name, objective="latency", policy="scripted")
    store.put_run(run)
    proposal = _submit(store, task, kit)
    decide(store, proposal.id, reviewer="ana", action="approve", patch_hash=proposal.patch_hash)
    kit.edit_stored_patch(tmp_path / "runs.db", proposal.patch_id, EDITS["a changed line"])
    ctx = SimpleNamespace(store=store, log=RunLog(store, run.id), on_event=lambda text: None)
    state = AgentState(run_id=run.id, review={proposal.id: ProposalStatus.APPROVED})
    update = apply(state, SimpleNamespace(context=ctx))  # type: ignore[arg-type]
    assert update == {"phase": "done", "applied": {}}
    [note] = [s for s in store.steps(run.id) if s.name == "apply"]
    assert note.content == f"proposal {proposal.id} not applied"
    assert note.error is not None and "changed after it was verified" in note.error
    assert store.get_proposal(proposal.id).status == ProposalStatus.APPROVED
    assert not (tmp_path / "home" / "workspaces").exists()


def test_a_knob_change_edited_in_place_is_not_approved(store, task, kit, tmp_path) -> None:
    import sqlite3

    patch = kit.knob_patch_record({"max_batch": 32})
    proposal = _submit(store, task, kit, patch)  # auto-approved (low risk)
    with sqlite3.connect(tmp_path / "runs.db") as conn:
        conn.execute(
            "UPDATE patches SET body=replace(body, '\"max_batch\":32', '\"max_batch\":256') "
            "WHERE id=?",
            (patch.id,),
        )
    assert store.get_patch(patch.id).knobs == {"max_batch": 256}
    with pytest.raises(UserError, match="refusing to apply"):
        apply_approved(store, proposal.id, reviewer="ana", args_file=tmp_path / "args.toml")
    assert not (tmp_path / "args.toml").exists()


def test_the_applied_commit_is_the_verified_workspace_byte_for_byte(
    store, task, kit, tmp_path
) -> None:
    # A change that touches an existing file (keeping its missing final newline) and adds one.
    (task.workspace / "scheduler.py").write_text(
        (task.workspace / "scheduler.py").read_text().rstrip("\n")
    )
    toml = task.root / "task.toml"
    toml.write_text(toml.read_text().replace('["scheduler.py"]', '["scheduler.py", "batching.py"]'))
    task = load_task(task.root)
    diff = (
        "--- a/scheduler.py\n+++ b/scheduler.py\n@@ -8,3 +8,3 @@ def next_batch(queue, max_batch):\n"
        "             break\n         batch.append(request)\n-    return batch\n"
        "\\ No newline at end of file\n+    return batch  # unchanged order\n"
        "\\ No newline at end of file\n"
        "--- /dev/null\n+++ b/batching.py\n@@ -0,0 +1,2 @@\n+MAX = 8\n+\tTABS = '\\t'  \n"
    )
    patch = parse_diff(diff, author="scripted-llm", rationale="keep order")
    proposal = _submit(store, task, kit, patch.to_record())
    decide(store, proposal.id, reviewer="ana", action="approve", patch_hash=proposal.patch_hash)
    done = apply_approved(store, proposal.id, reviewer="ana", data_dir=tmp_path / "data")
    repo = tmp_path / "data" / "workspaces" / task.name
    measured = preview_apply(patch, task)  # the experiment's own apply, on the same baseline
    try:
        assert _tree(repo, f"infra-agent/{proposal.id}", kit) == _files(measured / "ws")
    finally:
        import shutil

        shutil.rmtree(measured)
    assert done.status == ProposalStatus.APPLIED
    data = tmp_path / "data"  # the workspace copy and its git objects are private
    loose = [p for p in [data, *data.rglob("*")] if p.lstat().st_mode & 0o077]
    assert loose == []


@pytest.mark.slow
def test_reverify_measures_the_edited_bytes_and_rebinds_the_proposal(store, kit, tmp_path) -> None:
    task = load_task(kit.matmul_copy(tmp_path, "matmul-rebind"))
    patch = parse_diff((task.root / "reference.patch").read_text(), rationale="x @ w").to_record()
    proposal = _submit(store, task, kit, patch)
    kit.edit_stored_patch(
        tmp_path / "runs.db",
        patch.id,
        lambda d: d.replace("+    return x @ w", "+    return x.matmul(w)"),
    )
    edited = Patch.from_record(store.get_patch(patch.id))
    done = reverify(store, proposal.id, reviewer="ana")  # a real experiment on the edited bytes
    assert done.patch_hash == done.patch_id == edited.hash != patch.id
    latest = store.get_experiment(done.experiment_ids[-1])
    assert latest.patch_id == edited.hash
    last = store.decisions(proposal.id)[-1]
    assert (
        last.action == DecisionAction.REVERIFY and "changed after it was verified" in last.comment
    )
    assert staleness(store, done) is None
    with pytest.raises(StaleProposal, match="you reviewed patch"):  # a page showing the old bytes
        decide(store, proposal.id, reviewer="ana", action="approve", patch_hash=patch.id)
    decide(store, proposal.id, reviewer="ana", action="approve", patch_hash=edited.hash)
    apply_approved(store, proposal.id, reviewer="ana", data_dir=tmp_path / "data")
    repo = tmp_path / "data" / "workspaces" / task.name
    committed = _tree(repo, f"infra-agent/{proposal.id}", kit)
    assert b"return x.matmul(w)" in committed["projection.py"]
