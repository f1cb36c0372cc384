"""`infra-agent review ...` for terminal users and scripts: --json documents, one-line errors."""

from __future__ import annotations

import json

from support import run_cli
from typer.testing import CliRunner

from infra_agent.cli import app
from infra_agent.review.queue import submit_proposal
from infra_agent.store import open_store
from infra_agent.store.records import ProposalStatus


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return 99, f"{type(result.exception).__name__}: {result.exception}"
    return result.exit_code, result.stdout


def _seed(tmp_path, kit, n: int = 2) -> tuple[str, list]:  # type: ignore[no-untyped-def]
    db = tmp_path / "runs.db"
    store = open_store(db)
    task = kit.make_task(tmp_path / "toy")
    proposals = []
    for i in range(n):
        patch = kit.diff_patch(kit.SCHED_DIFF.replace("Slicing", f"Slicing {i}"))
        exp = kit.experiment_for(task, patch, speedup=1.1 + i * 0.2)
        proposals.append(
            submit_proposal(
                store, task=task, patch=patch, experiment=exp, rationale=f"r{i}", run_id=None
            )
        )
    store.close()
    return str(db), proposals


def test_list_and_show_json(tmp_path, kit) -> None:  # type: ignore[no-untyped-def]
    db, proposals = _seed(tmp_path, kit)
    code, out = _cli("--db", db, "review", "list", "--json")
    assert code == 0, out
    listed = json.loads(out)
    assert [p["id"] for p in listed] == [proposals[1].id, proposals[0].id]  # larger gain first
    code, out = _cli("--db", db, "review", "show", proposals[0].id, "--json")
    detail = json.loads(out)
    assert detail["proposal"]["id"] == proposals[0].id
    assert detail["patch"]["id"] == proposals[0].patch_hash
    assert detail["experiments"][0]["result"]["verdict"] == "IMPROVED"
    assert detail["stale_reason"] is None


def test_approve_with_patch_hash_prefix_applies_and_reject_is_told_who_won(
    tmp_path, kit, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("INFRA_AGENT_HOME", str(tmp_path / "home"))
    db, proposals = _seed(tmp_path, kit)
    p = proposals[0]
    code, out = _cli(
        "--db",
        db,
        "review",
        "approve",
        p.id,
        "--reviewer",
        "ana",
        "--patch-hash",
        p.patch_hash[:12],
        "--json",
    )
    assert code == 0, out
    report = json.loads(out)
    assert report["proposal"]["status"] == "applied"
    assert f"infra-agent/{p.id}" in report["proposal"]["applied_to"]
    code, out = _cli("--db", db, "review", "reject", p.id, "--reviewer", "bo")
    assert code != 0 and "already decided by ana" in out


def test_request_changes_and_wrong_hash(tmp_path, kit) -> None:  # type: ignore[no-untyped-def]
    db, proposals = _seed(tmp_path, kit)
    p = proposals[1]
    code, out = _cli("--db", db, "review", "approve", p.id, "--patch-hash", "deadbeefdeadbeef")
    assert code != 0 and "reload" in out
    code, out = _cli(
        "--db", db, "review", "request-changes", p.id, "--comment", "use a deque", "--json"
    )
    assert code == 0, out
    store = open_store(db, readonly=True)
    assert store.get_proposal(p.id).status == ProposalStatus.CHANGES_REQUESTED
    assert store.decisions(p.id)[0].comment == "use a deque"


def test_unknown_proposal_is_one_line_error(tmp_path, kit) -> None:  # type: ignore[no-untyped-def]
    db, _ = _seed(tmp_path, kit, n=1)
    result = run_cli("--db", db, "review", "approve", "prop-nope")
    assert result.returncode == 2
    assert result.stderr.strip() == "error: proposal 'prop-nope' not found"
    assert result.stdout == ""


def test_show_knob_change_as_baseline_to_proposed_and_list_marks_cuts(tmp_path, kit) -> None:  # type: ignore[no-untyped-def]
    db = tmp_path / "runs.db"
    store = open_store(db)
    task = kit.make_task(tmp_path / "toy")
    patch = kit.knob_patch_record({"max_batch": 32})
    proposal = submit_proposal(
        store,
        task=task,
        patch=patch,
        experiment=kit.experiment_for(task, patch),
        rationale="bigger batches " + "w" * 100,
        run_id=None,
    )
    store.close()
    code, out = _cli("--db", str(db), "review", "show", proposal.id)
    assert code == 0, out
    assert "knob max_batch: 8 -> 32" in out  # the task's default, then the proposed value
    code, out = _cli("--db", str(db), "review", "list", "--status", "all")
    assert code == 0, out
    assert "…" in out and "w" * 100 not in out.replace("\n", "").replace(" ", "")
