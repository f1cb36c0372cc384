"""The store's export columns (`store.columns`): written with each body, added to older stores by
their first writer, read through ADBC exactly as the bodies say, and used by exports only where
they exist (same bytes either way)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pytest

from infra_agent.experiments.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)
from infra_agent.store import open_store, sqlite
from infra_agent.store.columns import (
    DECISION_FIELDS,
    EXPERIMENT_FIELDS,
    PROPOSAL_FIELDS,
    _in_order,
    step_type,
)
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    PatchKind,
    PatchRecord,
    ProposalRecord,
    RunRecord,
    StepRecord,
    ToolCall,
)
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ExportFormat
from infra_agent.trajectories.redact import Redactor

STEP_TYPE = step_type()


def _steps(run_id: str, i: int) -> list[StepRecord]:
    """A conversation whose optional fields are set in some runs only (i picks which)."""
    calls = [ToolCall(id=f"c{i}-{k}", name=["bench", "profile"][k % 2],
                      arguments=["", f'{{"n": {k}}}', "not json"][(i + k) % 3])
             for k in range(i % 3)]  # fmt: skip
    steps = [
        StepRecord(run_id=run_id, role="system", content="You tune kernels."),
        StepRecord(run_id=run_id, role="user", content=f"Make task {i} faster, café ✓"),
        StepRecord(
            run_id=run_id,
            role="assistant",
            content="" if i % 4 == 0 else f"try {i}",
            reasoning_content="think" if i % 2 else None,
            tool_calls=calls,
            prompt_tokens=100 + i if i % 5 else None,
            completion_tokens=7 if i % 5 else None,
            cost_usd=0.25 * i if i % 3 else None,
        ),
    ]
    for call in calls:
        steps.append(
            StepRecord(
                run_id=run_id,
                role="tool",
                tool_call_id=call.id,
                name=call.name,
                content="" if i % 7 == 0 else "ok",
                error="timed out" if i % 7 == 0 else None,
            )
        )
    steps.append(StepRecord(run_id=run_id, role="harness", content="budget: 3 left"))
    return steps


def _experiment(run: RunRecord, i: int) -> ExperimentRecord:
    perf = PerformanceEvidence(
        metric="latency_ms", unit="ms", higher_is_better=False, baseline_median=10.0,
        candidate_median=8.0, speedup=1.25, ci_low=1.1, ci_high=1.4 + i, n_samples=8,
    )  # fmt: skip
    corr = CorrectnessEvidence(passed=i % 2 == 0, checks=3, baseline_err_f64=1e-7 if i else None)
    result = ExperimentResult(
        task=run.task,
        patch_id=f"p{i}",
        verdict=[Verdict.IMPROVED, Verdict.INCORRECT, Verdict.NO_CHANGE][i % 3],
        reasons=["measured"],
        flags=[Flag.SUSPICIOUS, Flag.NOISY] if i % 4 == 1 else [],
        evidence=Evidence(
            performance=perf if i % 3 != 2 else None, correctness=corr if i % 5 != 4 else None
        ),
    )
    return ExperimentRecord(run_id=run.id, task=run.task, patch_id=f"p{i}", result=result)


def _populate(path: Path, n: int, plain_first: int = 0) -> list[str]:
    """n runs; the first `plain_first` have only steps without optional values."""
    store = open_store(path)
    ids = []
    with store.transaction():
        for i in range(n):
            run = RunRecord(task=f"t{i % 3}", objective="latency", policy="llm")
            store.put_run(run)
            ids.append(run.id)
            if i < plain_first:
                store.add_step(StepRecord(run_id=run.id, role="assistant", content="plain"))
                continue
            for step in _steps(run.id, i):
                store.add_step(step)
            store.put_patch(PatchRecord(id=f"p{i}", kind=PatchKind.KNOBS, knobs={"k": i}))
            experiment = _experiment(run, i)
            store.put_experiment(experiment)
            if i % 2:
                proposal = ProposalRecord(run_id=run.id, task=run.task, patch_id=f"p{i}",
                                          patch_hash=f"h{i}", experiment_ids=[experiment.id])  # fmt: skip
                store.put_proposal(proposal)
                for action in [DecisionAction.APPROVE, DecisionAction.REJECT][: i % 3]:
                    store.add_decision(DecisionRecord(proposal_id=proposal.id, reviewer="r",
                                                      patch_hash=f"h{i}", action=action))  # fmt: skip
    store.close()
    return ids


def _as_version_1(src: Path, dst: Path) -> None:
    """`src`'s records in a store file as infra-agent wrote them before the export columns."""
    conn = sqlite3.connect(dst, isolation_level=None)
    conn.executescript(sqlite._SCHEMA)
    conn.execute("INSERT INTO meta (key, value) VALUES ('schema_version', '1')")
    conn.execute("ATTACH DATABASE ? AS src", (str(src),))
    tables = {"runs": "id, created_at, body", "steps": "run_id, seq, body",
              "patches": "id, body", "experiments": "id, run_id, started_at, body",
              "proposals": "id, run_id, status, created_at, body",
              "decisions": "id, proposal_id, created_at, body"}  # fmt: skip
    for table, cols in tables.items():
        conn.execute(f"INSERT INTO {table} ({cols}) SELECT {cols} FROM src.{table}")
    conn.execute("DETACH DATABASE src")
    conn.close()


def _bodies_as_columns(store: sqlite.SQLiteRunStore, ids: list[str]) -> pa.Array:
    bodies = store.step_bodies_of_runs(ids)
    return pa.array([b for i in ids for b in bodies.get(i, [])], type=STEP_TYPE)


def test_step_and_experiment_columns_equal_the_bodies(tmp_path: Path) -> None:
    ids = _populate(tmp_path / "runs.db", 40)
    store = open_store(tmp_path / "runs.db", readonly=True)
    assert isinstance(store, sqlite.SQLiteRunStore) and store.has_columns
    order = ids[::-1]  # runs come back in the order asked, not the store's
    columns = store.step_columns_of_runs(order)
    assert columns is not None
    assert columns.steps.equals(_bodies_as_columns(store, order))
    bodies = store.step_bodies_of_runs(order)
    assert columns.counts.tolist() == [len(bodies[i]) for i in order]
    assert store.experiment_columns_of_runs(ids) == store.experiment_fields_of_runs(
        ids, EXPERIMENT_FIELDS
    )
    assert store.review_columns() == store.review_fields(PROPOSAL_FIELDS, DECISION_FIELDS)
    assert len(store.review_columns()[1]) > 0  # type: ignore[index]
    empty = store.step_columns_of_runs(["no-such-run"])
    assert empty is not None and len(empty.steps) == 0 and empty.counts.tolist() == [0]
    store.close()


def test_types_hold_when_the_first_runs_have_no_optional_values(tmp_path: Path) -> None:
    # ADBC infers a column's type from the first batch of rows it reads (8192 rows): 9000
    # steps with no error, tokens, cost or reasoning come first, then steps that have them.
    ids = _populate(tmp_path / "runs.db", 9040, plain_first=9000)
    store = open_store(tmp_path / "runs.db", readonly=True)
    assert isinstance(store, sqlite.SQLiteRunStore)
    columns = store.step_columns_of_runs(ids)
    assert columns is not None and columns.steps.type == STEP_TYPE
    assert columns.steps.equals(_bodies_as_columns(store, ids))
    assert columns.steps.field("error").null_count < len(columns.steps)
    assert store.experiment_columns_of_runs(ids) == store.experiment_fields_of_runs(
        ids, EXPERIMENT_FIELDS
    )
    store.close()


def test_an_older_store_gains_the_columns_when_a_writer_opens_it(tmp_path: Path) -> None:
    ids = _populate(tmp_path / "new.db", 30)
    _as_version_1(tmp_path / "new.db", tmp_path / "old.db")
    reader = open_store(tmp_path / "old.db", readonly=True)
    assert isinstance(reader, sqlite.SQLiteRunStore) and not reader.has_columns
    assert reader.step_columns_of_runs(ids) is None
    assert reader.experiment_columns_of_runs(ids) is None
    assert reader.review_columns() is None
    reader_fields = reader.review_fields(PROPOSAL_FIELDS, DECISION_FIELDS)
    # Exports of the older file read the bodies instead: the same bytes.
    redactor = Redactor([])
    old_out, new_out = tmp_path / "old.parquet", tmp_path / "new.parquet"
    export_dataset(reader, ExportFormat.RL, old_out, parquet=True, redactor=redactor)
    reader.close()
    new = open_store(tmp_path / "new.db", readonly=True)
    export_dataset(new, ExportFormat.RL, new_out, parquet=True, redactor=redactor)
    assert old_out.read_bytes() == new_out.read_bytes()

    writer = open_store(tmp_path / "old.db")  # migrates
    assert isinstance(writer, sqlite.SQLiteRunStore) and writer.has_columns
    migrated = writer.step_columns_of_runs(ids)
    native = new.step_columns_of_runs(ids)  # type: ignore[attr-defined]
    assert migrated is not None and native is not None
    assert migrated.steps.equals(native.steps)
    assert migrated.counts.tolist() == native.counts.tolist()
    assert writer.experiment_columns_of_runs(ids) == new.experiment_columns_of_runs(ids)  # type: ignore[attr-defined]
    assert writer.review_columns() == new.review_columns()  # type: ignore[attr-defined]
    assert reader_fields == writer.review_fields(PROPOSAL_FIELDS, DECISION_FIELDS)
    conn = sqlite3.connect(tmp_path / "old.db")
    assert conn.execute("SELECT value FROM meta").fetchone() == ("2",)
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):  # still append-only
        conn.execute("UPDATE decisions SET action = 'approve'")
    conn.close()
    writer.close()
    new.close()


def test_columns_hold_the_redacted_values(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task="t", objective="latency", policy="llm")
    store.put_run(run)
    key = "sk-" + "A1b2C3d4E5f6G7h8J9k0"
    store.add_step(StepRecord(run_id=run.id, role="user", content=f"use {key} please",
                              tool_calls=[ToolCall(id="c", name="x", arguments=f'{{"key": "{key}"}}')]))  # fmt: skip
    columns = store.step_columns_of_runs([run.id])  # type: ignore[attr-defined]
    text = str(columns.steps.to_pylist())
    assert key not in text and "[REDACTED]" in text
    store.close()


def test_a_store_whose_calls_disagree_with_its_steps_is_refused(tmp_path: Path) -> None:
    ids = _populate(tmp_path / "runs.db", 5)
    conn = sqlite3.connect(tmp_path / "runs.db", isolation_level=None)
    conn.execute("DELETE FROM step_calls WHERE idx = 0")
    conn.close()
    store = open_store(tmp_path / "runs.db", readonly=True)
    with pytest.raises(Exception, match="step_calls disagree with steps.n_calls"):
        store.step_columns_of_runs(ids)  # type: ignore[attr-defined]
    store.close()


def test_rows_in_another_order_are_sorted() -> None:
    table = pa.table(
        {"k": [0, 1, 0, -1, 1], "seq": [1, 0, 0, -1, 1], "v": ["b", "c", "a", "", "d"]}
    )
    assert _in_order(table, 2).column("v").to_pylist() == ["", "a", "b", "c", "d"]
    ordered = _in_order(table, 2)
    assert _in_order(ordered, 2) is ordered  # already in order: kept as it is
