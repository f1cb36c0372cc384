"""The column-wise messages (`chat_columns`) give exactly the rows of `rows.run_row`, for runs in
the simple shape and, through the fallback, for every other shape."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from random_store import random_rewards_store
from trajectory_store import Fixture

from infra_agent.store import open_store
from infra_agent.store.records import RunRecord, StepRecord, ToolCall
from infra_agent.trajectories.build import ReviewIndex
from infra_agent.trajectories.chat_columns import WHITESPACE, ChatColumns
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ExportFormat
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.rows import run_row
from infra_agent.trajectories.run_columns import RunColumns
from infra_agent.trajectories.trusted import TrustedReview, load_trusted_runs
from infra_agent.trajectories.writers import arrow_table

CHAT = (ExportFormat.OPENAI_SFT, ExportFormat.RL)


def _shapes(db: Path) -> dict[str, bool]:
    """A store with one run per conversation shape: run task -> whether it is simple."""
    store = open_store(db)
    at = iter(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i) for i in range(1000))
    expected: dict[str, bool] = {}

    def run(name: str, simple: bool, *steps: dict[str, Any]) -> None:
        record = RunRecord(task=name, objective="latency", policy="llm", model="m",
                           created_at=next(at))  # fmt: skip
        store.put_run(record)
        for fields in steps:
            store.add_step(StepRecord(run_id=record.id, created_at=next(at), **fields))
        expected[name] = simple

    def call(i: str, args: str = "{}", name: str = "profile") -> ToolCall:
        return ToolCall(id=i, name=name, arguments=args)

    sys_, user = {"role": "system", "content": "sys"}, {"role": "user", "content": "go"}
    run("plain", True, sys_, user,
        {"role": "assistant", "content": "a", "reasoning_content": "why", "prompt_tokens": 3,
         "completion_tokens": 2, "cost_usd": 0.1, "tool_calls": [call("c1", '{"x": 1}')]},
        {"role": "tool", "tool_call_id": "c1", "name": "profile", "content": "r1"},
        {"role": "assistant", "content": "done", "cost_usd": 0.2, "prompt_tokens": 4},
        {"role": "assistant", "content": "more", "cost_usd": 0.7})  # fmt: skip
    run("harness between, parallel calls, blank and odd arguments, errors", True, user,
        {"role": "assistant", "content": "", "reasoning_content": "",
         "tool_calls": [call("a", " \n\t"), call("b", WHITESPACE), call("c", ""),
                        call("d", "[1, 2]", "made_up"), call("e", '{"k": ', "made_up"),
                        call("f", WHITESPACE + "x")]},
        {"role": "harness", "name": "decision", "content": "note", "cost_usd": 1.5},
        {"role": "tool", "tool_call_id": "b", "content": "", "error": "bad args"},
        {"role": "tool", "tool_call_id": "a", "content": "", "error": ""},
        {"role": "tool", "tool_call_id": "c", "content": "", "error": None},
        {"role": "tool", "tool_call_id": "d", "content": "ok", "error": "ignored"},
        {"role": "tool", "tool_call_id": "f", "content": "é ✓ \u2028 \x00"},
        {"role": "assistant", "content": "end"})  # fmt: skip
    run("reasoning and call ids where they are not shown", True,
        {"role": "user", "content": "u", "reasoning_content": "hidden", "tool_call_id": "x"},
        {"role": "assistant", "content": "a", "reasoning_content": "shown", "tool_call_id": "y",
         "tool_calls": [call("k1")]},
        {"role": "tool", "tool_call_id": "k1", "content": "r", "reasoning_content": "hidden"},
        {"role": "harness", "content": "n", "reasoning_content": "hidden", "tool_call_id": "z"},
        {"role": "assistant", "content": "b"})  # fmt: skip
    run("tool calls on a user message are counted, not shown", True,
        {"role": "user", "content": "u", "tool_calls": [call("u1", "{}", "user_tool")]},
        {"role": "assistant", "content": "a"})  # fmt: skip
    run("orphan result first", False,
        {"role": "tool", "tool_call_id": "x", "content": "early"}, user,
        {"role": "assistant", "content": "a"})  # fmt: skip
    run("orphan result without id", False, user,
        {"role": "tool", "tool_call_id": None, "content": "", "error": "orphan error"},
        {"role": "assistant", "content": "a"})  # fmt: skip
    run("result after a later message", False, user,
        {"role": "assistant", "content": "a1", "tool_calls": [call("c1")]},
        {"role": "user", "content": "hurry"},
        {"role": "tool", "tool_call_id": "c1", "content": "late"},
        {"role": "assistant", "content": "a2"})  # fmt: skip
    run("result for an earlier turn's call", False, user,
        {"role": "assistant", "content": "a1", "tool_calls": [call("c1")]},
        {"role": "assistant", "content": "a2", "tool_calls": [call("c2")]},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
        {"role": "tool", "tool_call_id": "c1", "content": "r1"})  # fmt: skip
    run("unknown call id", False, user,
        {"role": "assistant", "content": "a1", "tool_calls": [call("c1")]},
        {"role": "tool", "tool_call_id": "zz", "content": "to the last turn"})  # fmt: skip
    run("one call answered twice", False, user,
        {"role": "assistant", "content": "a1", "tool_calls": [call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": ""},
        {"role": "tool", "tool_call_id": "c1", "content": "", "error": "second"})  # fmt: skip
    run("result after a user turn with no call", False, user,
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "a"})  # fmt: skip
    run("no assistant", True, user, {"role": "harness", "content": "n", "prompt_tokens": 7})
    run("no steps", True)
    run("only harness", True, {"role": "harness", "content": "n"})
    store.close()
    return expected


def _columnar(store: Any, fmt: ExportFormat, weights: dict[str, float]) -> tuple[pa.Table, Any]:
    """(the table of the column-wise path, each run's reward, verdicts and skip), all runs in one
    batch, runs that form no row left out."""
    bundles = load_trusted_runs(store, list(store.iter_runs()), TrustedReview(store))
    chat = ChatColumns.of_bundles(bundles)
    columns = RunColumns.of_bundles(bundles, chat, weights)
    made = [(columns.reward[i], columns.verdicts[i], chat.skip(i)) for i in range(len(bundles))]
    kept = [i for i, m in enumerate(made) if m[2] is None]
    return columns.table(fmt, kept, None), made


def _reference(store: Any, fmt: ExportFormat, weights: dict[str, float]) -> tuple[pa.Table, Any]:
    bundles = load_trusted_runs(store, list(store.iter_runs()), ReviewIndex(store))
    made = [run_row(b, fmt, weights) for b in bundles]
    rows = [m.row for m in made if m.skip is None]
    return arrow_table(fmt, rows), [(m.reward, m.verdicts, m.skip) for m in made]


@pytest.mark.parametrize("fmt", CHAT)
def test_every_shape_gives_the_rows_of_run_row(tmp_path: Path, fmt: ExportFormat) -> None:
    expected = _shapes(tmp_path / "shapes.db")
    store = open_store(tmp_path / "shapes.db", readonly=True)
    bundles = load_trusted_runs(store, list(store.iter_runs()), ReviewIndex(store))
    simple = ChatColumns.of_bundles(bundles).simple
    assert {b.run.task: bool(s) for b, s in zip(bundles, simple, strict=True)} == expected
    weights = RewardWeights().model_dump()
    table, made = _columnar(store, fmt, weights)
    reference, reference_made = _reference(store, fmt, weights)
    assert made == reference_made
    assert table.to_pylist() == reference.to_pylist()
    assert table.equals(reference)
    assert table.num_rows == len(expected) - 3  # no assistant, no steps, only harness


@pytest.mark.parametrize("fmt", CHAT)
def test_fixture_runs_give_the_rows_of_run_row(fx: Fixture, fmt: ExportFormat) -> None:
    store = open_store(fx.db, readonly=True)
    weights = RewardWeights(review=3.0).model_dump()
    table, made = _columnar(store, fmt, weights)
    reference, reference_made = _reference(store, fmt, weights)
    assert made == reference_made and table.equals(reference)


@pytest.mark.parametrize("fmt", CHAT)
@pytest.mark.parametrize("batch_rows", [1, 4, 512])
def test_parquet_export_writes_the_bytes_of_the_row_path(
    tmp_path: Path, fmt: ExportFormat, batch_rows: int
) -> None:
    """Simple and fallback runs mixed in one batch, or alone: the file is byte for byte the one
    the reference path (validated records, row by row) writes."""
    _shapes(tmp_path / "shapes.db")
    store = open_store(tmp_path / "shapes.db", readonly=True)
    fast, slow = tmp_path / "fast.parquet", tmp_path / "slow.parquet"
    a = export_dataset(store, fmt, fast, parquet=True, batch_rows=batch_rows)
    b = export_dataset(store, fmt, slow, parquet=True, batch_rows=batch_rows, trusted_bodies=False)
    assert fast.read_bytes() == slow.read_bytes()
    assert a.model_dump(exclude={"path", "seconds"}) == b.model_dump(exclude={"path", "seconds"})
    assert a.skipped == {"no assistant message": 2, "no steps recorded": 1}


def test_whitespace_is_what_strip_removes() -> None:
    assert set(WHITESPACE) == {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()}


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("fmt", CHAT)
def test_random_rewards_equal_the_row_path(tmp_path: Path, fmt: ExportFormat, seed: int) -> None:
    random_rewards_store(tmp_path / "r.db", seed)
    store = open_store(tmp_path / "r.db", readonly=True)
    for weights in (RewardWeights(), RewardWeights(review=3.0, failure=0.3, correctness=0.1)):
        w = weights.model_dump()
        table, made = _columnar(store, fmt, w)
        reference, reference_made = _reference(store, fmt, w)
        assert made == reference_made
        assert table.to_pylist() == reference.to_pylist()
        assert table.equals(reference)
    fast, slow = tmp_path / "fast.parquet", tmp_path / "slow.parquet"
    export_dataset(store, fmt, fast, parquet=True, batch_rows=16)
    export_dataset(store, fmt, slow, parquet=True, batch_rows=16, trusted_bodies=False)
    assert fast.read_bytes() == slow.read_bytes()
