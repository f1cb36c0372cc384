"""The run store: every record type round-trips, transactions are all-or-nothing, schema checks."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra_agent.errors import StoreError
from infra_agent.store import SQLiteRunStore, open_store
from infra_agent.store.records import (
    STORE_SCHEMA_VERSION,
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    FeedbackRecord,
    PatchKind,
    PatchRecord,
    ProposalRecord,
    ProposalStatus,
    RunRecord,
    RunStatus,
    StepRecord,
    ToolCall,
)
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)


def _result() -> ExperimentResult:
    return ExperimentResult(
        task="example",
        patch_id="abc123",
        verdict=Verdict.IMPROVED,
        reasons=["speedup 1.52x, 95% CI 1.48-1.57 excludes 1.0"],
        flags=[Flag.NOISY],
        evidence=Evidence(
            stage_reached="health",
            correctness=CorrectnessEvidence(passed=True, checks=3, max_abs_err=1e-6),
            performance=PerformanceEvidence(
                metric="latency_ms",
                unit="ms",
                higher_is_better=False,
                baseline_median=10.0,
                candidate_median=6.6,
                speedup=1.52,
                ci_low=1.48,
                ci_high=1.57,
                n_samples=12,
                baseline_samples=[10.0, 10.1],
                candidate_samples=[6.6],
            ),  # fmt: skip
        ),
    )


def test_every_record_type_round_trips(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task="example", objective="throughput", policy="search")
    store.put_run(run)
    step = store.add_step(
        StepRecord(
            run_id=run.id,
            role="assistant",
            content="measure first",
            reasoning_content="the split loop recomputes the max",
            tool_calls=[ToolCall(id="c1", name="bench", arguments='{"target": "a:b"}')],
            prompt_tokens=100,
            completion_tokens=20,
            cost_usd=0.001,
            logprobs=[{"token": "x", "logprob": -0.1}],
        )  # fmt: skip
    )
    tool = store.add_step(
        StepRecord(run_id=run.id, role="tool", content="FASTER", tool_call_id="c1")
    )
    patch = PatchRecord(id="abc123", kind=PatchKind.DIFF, diff="--- a/x\n+++ b/x\n", files=["x"])
    store.put_patch(patch)
    exp = ExperimentRecord(run_id=run.id, task="example", patch_id=patch.id, result=_result())
    store.put_experiment(exp)
    fb = FeedbackRecord(
        run_id=run.id, instrument="bench", record={"verdict": "FASTER"}, rendering="x"
    )
    store.put_feedback(fb)
    prop = ProposalRecord(run_id=run.id, task="example", patch_id=patch.id, patch_hash=patch.id)
    store.put_proposal(prop)
    dec = DecisionRecord(
        proposal_id=prop.id, reviewer="ana", action=DecisionAction.APPROVE, patch_hash=patch.id
    )
    store.add_decision(dec)
    store.close()

    # A second, independent connection (as another process would) reads everything back.
    again = SQLiteRunStore(tmp_path / "runs.db", readonly=True)
    assert again.get_run(run.id) == run.model_copy(
        update={"updated_at": again.get_run(run.id).updated_at}
    )  # type: ignore[union-attr]
    assert again.steps(run.id) == [step, tool]
    assert [s.seq for s in again.steps(run.id)] == [0, 1]
    assert again.get_patch("abc123") == patch
    assert again.get_experiment(exp.id) == exp
    assert again.experiments(run.id)[0].result.evidence.performance.ci_low == 1.48  # type: ignore[union-attr]
    assert again.feedback(run.id) == [fb]
    assert again.get_proposal(prop.id).patch_hash == "abc123"  # type: ignore[union-attr]
    assert again.decisions(prop.id) == [dec]


def test_failed_transaction_leaves_no_partial_step(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task="t", objective="throughput", policy="search")
    store.put_run(run)
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.add_step(StepRecord(run_id=run.id, role="assistant", content="call a tool"))
            store.add_step(StepRecord(run_id=run.id, role="tool", content="half"))
            raise RuntimeError("crash between the call and its result")
    assert store.steps(run.id) == []


def test_process_killed_mid_transaction_leaves_nothing(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    run = RunRecord(task="t", objective="throughput", policy="search")
    store.put_run(run)
    store.close()
    code = textwrap.dedent(
        f"""
        import os
        from infra_agent.store import open_store
        from infra_agent.store.records import StepRecord
        s = open_store({str(db)!r})
        with s.transaction():
            s.add_step(StepRecord(run_id={run.id!r}, role="assistant", content="before"))
            os._exit(9)  # the process dies without committing
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == 9
    assert open_store(db).steps(run.id) == []


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    open_store(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE meta SET value=? WHERE key='schema_version'", (str(STORE_SCHEMA_VERSION + 1),)
        )
    with pytest.raises(StoreError, match="newer"):
        open_store(db)


def test_garbage_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    db.write_bytes(b"this is not sqlite" * 100)
    before = db.read_bytes()
    with pytest.raises(StoreError, match="not a readable SQLite database"):
        open_store(db)
    assert db.read_bytes() == before


def test_decisions_are_append_only(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    dec = DecisionRecord(
        proposal_id="p", reviewer="r", action=DecisionAction.REJECT, patch_hash="h"
    )
    store.add_decision(dec)
    store.close()
    with sqlite3.connect(db) as conn, pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM decisions")


def test_proposal_status_compare_and_set(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    prop = ProposalRecord(task="t", patch_id="p", patch_hash="p")
    store.put_proposal(prop)
    assert store.set_proposal_status(prop.id, ProposalStatus.PENDING, ProposalStatus.APPROVED)
    # The second reviewer saw 'pending' too, but lost the race.
    assert not store.set_proposal_status(prop.id, ProposalStatus.PENDING, ProposalStatus.REJECTED)
    assert store.get_proposal(prop.id).status == ProposalStatus.APPROVED  # type: ignore[union-attr]
    assert [p.id for p in store.proposals(status=ProposalStatus.APPROVED)] == [prop.id]


def test_reader_sees_writes_while_writer_is_open(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    writer = open_store(db)
    reader = SQLiteRunStore(db, readonly=True)
    run = RunRecord(task="t", objective="latency", policy="llm", status=RunStatus.RUNNING)
    writer.put_run(run)
    assert reader.get_run(run.id) is not None
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_secrets_are_never_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-4f9a8b7c6d5e")
    db = tmp_path / "runs.db"
    store = open_store(db)
    run = RunRecord(task="t", objective="throughput", policy="llm", summary="used tok-4f9a8b7c6d5e")
    store.put_run(run)
    store.add_step(
        StepRecord(run_id=run.id, role="tool", content="Authorization: Bearer abcdef0123456789xyz")
    )
    result = _result()
    result.evidence.log_tail = "OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234 failed"
    store.put_experiment(ExperimentRecord(task="t", patch_id="p", result=result))
    store.add_decision(
        DecisionRecord(proposal_id="p", reviewer="r", action=DecisionAction.REJECT,
                       patch_hash="h", comment="my key is sk-proj-abcdefghijklmnop1234")
    )  # fmt: skip
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    for secret in (b"tok-4f9a8b7c6d5e", b"abcdef0123456789xyz", b"sk-proj-abcdefghijklmnop1234"):
        assert secret not in raw
    assert open_store(db).steps(run.id)[0].content.startswith("Authorization: ")


def test_a_measurement_that_is_not_a_number_reads_back(tmp_path: Path) -> None:
    """A NaN or infinite speedup (a zero baseline) is stored as such, and a NaN an earlier
    version stored as null reads back as NaN, instead of making the run unreadable."""
    import math

    store = open_store(tmp_path / "runs.db")
    result = _result()
    perf = result.evidence.performance
    assert perf is not None
    perf.speedup, perf.ci_low, perf.ci_high = math.nan, -math.inf, math.inf
    exp = ExperimentRecord(task="t", patch_id="p", result=result)
    store.put_experiment(exp)
    back = store.get_experiment(exp.id)
    assert back is not None and back.result.evidence.performance is not None
    got = back.result.evidence.performance
    assert math.isnan(got.speedup) and (got.ci_low, got.ci_high) == (-math.inf, math.inf)
    with store.transaction():
        store._conn().execute("UPDATE experiments SET body=replace(body, 'NaN', 'null')")
    again = store.get_experiment(exp.id)
    assert again is not None and again.result.evidence.performance is not None
    assert math.isnan(again.result.evidence.performance.speedup)


def test_a_broken_body_is_a_store_error(tmp_path: Path) -> None:
    """Records are read in order; a body that is not JSON is a StoreError naming the record type,
    not a crash."""
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task="t", objective="latency", policy="llm")
    store.put_run(run)
    for i in range(3):
        store.add_step(StepRecord(run_id=run.id, role="user", content=f"m{i} é"))
    assert [s.content for s in store.steps(run.id)] == ["m0 é", "m1 é", "m2 é"]
    with store.transaction():
        store._conn().execute("UPDATE steps SET body='{not json' WHERE seq=1")
    with pytest.raises(StoreError, match="a StepRecord row is malformed"):
        store.steps(run.id)


def test_reader_of_a_file_not_yet_initialised_gets_a_clear_error(tmp_path: Path) -> None:
    """A reader that opens the file between its creation and its schema (a writer starting up)
    gets a StoreError naming the file, not sqlite's 'no such table'."""
    db = tmp_path / "runs.db"
    sqlite3.connect(db).close()  # an empty database file, as a starting writer leaves it
    with pytest.raises(StoreError, match="runs.db: not an initialised infra-agent database"):
        SQLiteRunStore(db, readonly=True)
    open_store(db).close()
    assert SQLiteRunStore(db, readonly=True).list_runs() == []
