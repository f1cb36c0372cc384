"""Each format is a function of the trajectory; JSONL and Parquet carry the same columns and
values; the conversation, tool-call arguments and tool specs come out as the model saw them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from random_store import random_rewards_store
from trajectory_store import Fixture

from infra_agent.redact import Redactor
from infra_agent.store import open_store
from infra_agent.store.records import ExperimentRecord, RunRecord, StepRecord, ToolCall
from infra_agent.store.verdict import ExperimentResult, Verdict
from infra_agent.trajectories.arrow import read_rows
from infra_agent.trajectories.atif import Trajectory
from infra_agent.trajectories.build import build_trajectory, load_run
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import FORMATS, ExportFormat, chat_messages, tool_specs
from infra_agent.trajectories.writers import ParquetSink


def _both(
    store: Any, fmt: ExportFormat, tmp_path: Path, **kwargs: Any
) -> tuple[list[Any], list[Any]]:
    jsonl, parquet = tmp_path / f"{fmt.value}.jsonl", tmp_path / f"{fmt.value}.parquet"
    export_dataset(store, fmt, jsonl, **kwargs)
    export_dataset(store, fmt, parquet, parquet=True, **kwargs)
    return read_rows(jsonl), read_rows(parquet)


@pytest.mark.parametrize("fmt", list(ExportFormat))
def test_jsonl_and_parquet_agree_column_for_column(fx: Fixture, tmp_path: Path, fmt: ExportFormat) -> None:  # fmt: skip
    for store in (open_store(fx.db, readonly=True), _random(tmp_path)):
        jsonl, parquet = _both(store, fmt, tmp_path)
        columns = [f.name for f in FORMATS[fmt].schema]
        assert [list(r) for r in jsonl] == [columns] * len(jsonl)  # every field, in order
        assert [list(r) for r in parquet] == [columns] * len(parquet)
        for name in columns:  # values of every type, nulls and JSON values included
            assert [r[name] for r in jsonl] == [r[name] for r in parquet], name


def _random(tmp_path: Path) -> Any:
    """Random runs, and one whose measurement is not a number (exported as null in both) and
    whose evidence holds an integer beyond 64 bits."""
    import math

    from infra_agent.store.verdict import Evidence, PerformanceEvidence

    random_rewards_store(tmp_path / "random.db", 3, gone=0.2, orphans=True, runs=30)
    store = open_store(tmp_path / "random.db")
    run = RunRecord(task="nan", objective="latency", policy="llm")
    store.put_run(run)
    store.add_step(StepRecord(run_id=run.id, role="assistant", content="measured"))
    nan = PerformanceEvidence(metric="ms", unit="ms", higher_is_better=False, baseline_median=0,
                              candidate_median=0, speedup=math.nan, ci_low=math.nan, ci_high=math.nan,
                              n_samples=3)  # fmt: skip
    result = ExperimentResult(task="nan", patch_id="p", verdict=Verdict.NO_CHANGE, reasons=["0/0"],
                              evidence=Evidence(performance=nan, extra={"bytes": 2**70}))  # fmt: skip
    store.put_experiment(ExperimentRecord(run_id=run.id, task="nan", patch_id="p", result=result))
    store.close()
    return open_store(tmp_path / "random.db", readonly=True)


def test_the_atif_row_is_the_trajectory(fx: Fixture, tmp_path: Path) -> None:
    store = open_store(fx.db, readonly=True)
    jsonl, parquet = _both(store, ExportFormat.ATIF, tmp_path)
    run = store.get_run(fx.run_a)
    assert run is not None
    # The run's trajectory, redacted as exports redact (patches are stored as they are: their id
    # is the hash of their content, so a secret in a rationale is removed only here).
    built = build_trajectory(load_run(store, run)).model_dump(mode="json")
    reference = Trajectory.model_validate(Redactor.from_environment().tree(built))
    assert "[REDACTED]" in reference.extra.patches[1].rationale
    for rows in (jsonl, parquet):
        assert Trajectory.model_validate(rows[0]) == reference
    # Typed columns where the shape is fixed: the reward is a number a query can filter on.
    table = pq.read_table(tmp_path / "atif.parquet")
    assert (
        table.schema.field("final_metrics").type.field("extra").type.field("reward").type
        == pa.float64()
    )
    assert isinstance(table.schema.field("agent").type.field("extra").type, pa.JsonType)


def _edge_store(db: Path) -> RunRecord:
    store = open_store(db)
    run = RunRecord(task="t", objective="latency", policy="llm", model="m")
    store.put_run(run)
    at = iter(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i) for i in range(100))

    def step(**fields: Any) -> None:
        store.add_step(StepRecord(run_id=run.id, created_at=next(at), **fields))

    step(role="tool", tool_call_id="early", name="x", content="before any call")
    step(role="system", content="sys")
    step(role="user", content="go")
    step(role="tool", tool_call_id=None, name="x", content="", error="orphan error")
    step(role="assistant", content="a1", reasoning_content="", tool_calls=[
        ToolCall(id="c1", name="profile", arguments="  "),
        ToolCall(id="c2", name="made_up_tool", arguments="[1, 2]"),
    ])  # fmt: skip
    step(role="assistant", content="a2", tool_calls=[
        ToolCall(id="c3", name="profile", arguments='{"b": 1,   "a": {"z": "é"}}'),
        ToolCall(id="c4", name="profile", arguments='{"b": 2}'),
    ])  # fmt: skip
    step(role="harness", name="decision", content="note")
    step(role="tool", tool_call_id="c3", name="profile", content="r3")
    step(role="tool", tool_call_id="c1", name="profile", content="", error="bad args")
    step(role="tool", tool_call_id="unknown", name="profile", content="to the last turn")
    step(role="tool", tool_call_id="c2", name="made_up_tool", content="r2")
    step(role="assistant", content="done", prompt_tokens=5)
    store.close()
    return run


def test_conversation_edge_cases(tmp_path: Path) -> None:
    """Orphan tool results, results arriving after a harness note or out of order, parallel
    calls, blank / non-object / invalid / oddly spaced arguments, an error shown for an empty
    result: each message once, a result right after the turn that made its call."""
    run = _edge_store(tmp_path / "edge.db")
    store = open_store(tmp_path / "edge.db", readonly=True)
    messages = chat_messages(build_trajectory(load_run(store, run)))
    shown = [(m["role"], m["content"], m["tool_call_id"]) for m in messages]
    assert shown == [
        ("tool", "before any call", "early"),
        ("system", "sys", None),
        ("user", "go", None),
        ("tool", "orphan error", None),
        ("assistant", "a1", None),
        ("tool", "bad args", "c1"),  # empty result: the error is what the model was shown
        ("tool", "r2", "c2"),
        ("assistant", "a2", None),
        ("tool", "r3", "c3"),
        ("tool", "to the last turn", "unknown"),  # an unknown call joins the latest turn
        ("assistant", "done", None),
    ]
    arguments = {
        c["id"]: c["function"]["arguments"] for m in messages for c in m["tool_calls"] or []
    }
    # The model's text verbatim: its spacing, non-objects, non-ASCII; `{}` when blank.
    assert arguments == {
        "c1": "{}",
        "c2": "[1, 2]",
        "c3": '{"b": 1,   "a": {"z": "é"}}',
        "c4": '{"b": 2}',
    }
    assert messages[4]["reasoning_content"] == ""
    assert [k for m in messages for k in m] == ["role", "content", "reasoning_content", "tool_calls", "tool_call_id"] * len(messages)  # fmt: skip


def test_tool_specs_of_every_kind(tmp_path: Path) -> None:
    """Runs that recorded their tools, called registry tools, unknown tools, none."""
    from infra_agent.tools.registry import default_registry

    registry = default_registry().schemas()
    names = {s["function"]["name"] for s in registry}
    assert {"profile", "microbench"} <= names
    store = open_store(tmp_path / "t.db")
    mine = [{"type": "function", "function": {"name": "mine"}}]
    minimal = {
        "type": "function",
        "function": {"name": "made_up", "parameters": {"type": "object"}},
    }
    kinds: list[tuple[dict[str, Any], list[str], list[Any]]] = [
        ({"tools": mine}, ["mine", "other"], mine),
        ({}, ["profile", "microbench", "profile"], registry),
        ({}, ["made_up"], [minimal]),
        ({}, ["profile", "made_up"], [*registry, minimal]),
        ({}, [], []),
        ({"tools": "not a list"}, ["profile"], registry),
    ]
    for config, called, _ in kinds:
        run = RunRecord(task="t", objective="latency", policy="llm", config=config)
        store.put_run(run)
        store.add_step(StepRecord(run_id=run.id, role="user", content="go"))
        calls = [ToolCall(id=f"c{k}", name=n, arguments="{}") for k, n in enumerate(called)]
        store.add_step(StepRecord(run_id=run.id, role="assistant", content="", tool_calls=calls))
    store.close()
    store = open_store(tmp_path / "t.db", readonly=True)
    specs = [tool_specs(build_trajectory(load_run(store, run))) for run in store.iter_runs()]
    assert specs == [expected for _, _, expected in kinds]
    jsonl, parquet = _both(store, ExportFormat.RL, tmp_path)
    assert [r["tools"] for r in jsonl] == [r["tools"] for r in parquet] == specs


def test_runs_without_a_conversation_are_skipped_with_the_reason(tmp_path: Path) -> None:
    """Each skip reason counted; an experiment recorded without the run id but named by the
    run's proposal still counts for the run."""
    from infra_agent.store.records import ProposalRecord

    store = open_store(tmp_path / "s.db")
    empty = RunRecord(task="t", objective="latency", policy="search")
    silent = RunRecord(task="t", objective="latency", policy="llm")
    talking = RunRecord(task="t", objective="latency", policy="llm")
    for run in (empty, silent, talking):
        store.put_run(run)
    store.add_step(StepRecord(run_id=silent.id, role="user", content="go"))
    store.add_step(StepRecord(run_id=talking.id, role="user", content="go"))
    store.add_step(StepRecord(run_id=talking.id, role="assistant", content="ok"))
    result = ExperimentResult(task="t", patch_id="p", verdict=Verdict.REGRESSED, reasons=["slower"])
    orphan = ExperimentRecord(run_id=None, task="t", patch_id="p", result=result)
    store.put_experiment(orphan)
    store.put_proposal(ProposalRecord(run_id=talking.id, task="t", patch_id="p", patch_hash="p",
                                      experiment_ids=[orphan.id]))  # fmt: skip
    store.close()
    store = open_store(tmp_path / "s.db", readonly=True)
    summary = export_dataset(store, ExportFormat.RL, tmp_path / "rl.jsonl")
    assert summary.rows == 1 and summary.runs_matched == 3
    assert summary.skipped == {"no steps recorded": 1, "no assistant message": 1}
    (row,) = read_rows(tmp_path / "rl.jsonl")
    assert row["verdicts"] == ["REGRESSED"] and row["reward_components"]["regression"] == -1.0


def test_the_file_does_not_depend_on_the_batches(tmp_path: Path) -> None:
    """Batch sizes and worker processes all write the same bytes (row groups are cut by rows,
    not by batch: `writers.ParquetSink`)."""
    store = _random(tmp_path)
    for fmt, parquet in [(ExportFormat.RL, True), (ExportFormat.ATIF, False)]:
        outputs = []
        for k, kwargs in enumerate([{}, {"batch_rows": 1}, {"batch_rows": 7}, {"jobs": 2}]):
            out = tmp_path / f"{k}.out"
            export_dataset(store, fmt, out, parquet=parquet, **kwargs)  # type: ignore[arg-type]
            outputs.append(out.read_bytes())
        assert all(o == outputs[0] for o in outputs), fmt


@pytest.mark.parametrize("sizes", [[3, 4, 10, 1, 0, 9], [25], [7, 7, 7], [0, 2]])
def test_the_sink_cuts_row_groups_by_rows(tmp_path: Path, sizes: list[int]) -> None:
    rows = pa.table(
        {"k": list(range(sum(sizes))), "s": [f"v{k}" * (k % 5) for k in range(sum(sizes))]}
    )
    streamed, whole = tmp_path / "streamed.parquet", tmp_path / "whole.parquet"
    with open(streamed, "wb") as f:
        sink = ParquetSink(f, rows.schema, row_group_rows=7)
        at = 0
        for n in sizes:
            sink.write(rows.slice(at, n))
            at += n
        sink.finish()
        sink.close()
    pq.write_table(rows, whole, row_group_size=7, compression="zstd")
    assert streamed.read_bytes() == whole.read_bytes()
    meta = pq.ParquetFile(streamed).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert groups == [7] * (sum(sizes) // 7) + ([sum(sizes) % 7] if sum(sizes) % 7 else [])


def test_jsonl_lines_are_json_documents(fx: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    export_dataset(open_store(fx.db, readonly=True), ExportFormat.OPENAI_SFT, out)
    assert all(isinstance(json.loads(line), dict) for line in out.read_text().splitlines())
