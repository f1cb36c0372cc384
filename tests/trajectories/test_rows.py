"""The export's fast path (`rows.run_row`) gives the rows `formats` derives from the Trajectory."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from trajectory_store import Fixture

from infra_agent.store import open_store
from infra_agent.store.records import RunRecord, StepRecord, ToolCall
from infra_agent.trajectories.build import ReviewIndex, RunBundle, build_trajectory, load_run
from infra_agent.trajectories.formats import ExportFormat, rl_row, sft_row
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.rows import arguments_text, run_row


def _both(bundle: RunBundle, fmt: ExportFormat, weights: RewardWeights) -> tuple[Any, Any]:
    """(fast row, row from the Trajectory), both redacted and as JSON would hold them, tool-call
    arguments that are JSON objects parsed (the fast path keeps the model's spacing)."""
    redactor = Redactor.from_environment()
    fast = run_row(bundle, fmt, weights.model_dump()).row
    fast = json.loads(redactor.texts([json.dumps(fast, ensure_ascii=False)])[0])
    t = build_trajectory(bundle, redactor=redactor, weights=weights)
    slow = sft_row(t) if fmt is ExportFormat.OPENAI_SFT else rl_row(t)
    return _parsed_arguments(fast), _parsed_arguments(json.loads(json.dumps(slow)))


def _parsed_arguments(row: dict[str, Any]) -> dict[str, Any]:
    messages = row.get("messages", []) + row.get("prompt", []) + row.get("completion", [])
    for call in [c for m in messages for c in m.get("tool_calls") or []]:
        try:
            value = json.loads(call["function"]["arguments"])
        except ValueError:
            continue  # not JSON: kept verbatim by both paths
        if isinstance(value, dict):
            call["function"]["arguments"] = value
    return row


@pytest.mark.parametrize("fmt", [ExportFormat.OPENAI_SFT, ExportFormat.RL])
@pytest.mark.parametrize("weights", [RewardWeights(), RewardWeights(review=3.0, failure=0.0)])
def test_fast_rows_equal_rows_of_the_trajectory(
    fx: Fixture, fmt: ExportFormat, weights: RewardWeights
) -> None:
    store = open_store(fx.db, readonly=True)
    review = ReviewIndex(store)
    for run in store.iter_runs():
        fast, slow = _both(load_run(store, run, review), fmt, weights)
        assert fast == slow, run.id


def test_conversation_edge_cases_match(tmp_path: Path) -> None:
    """Orphan tool results, results arriving after a harness note or out of order, parallel
    calls, blank / non-object / invalid arguments, an error shown for an empty result."""
    store = open_store(tmp_path / "edge.db")
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
    ])  # fmt: skip
    step(role="harness", name="decision", content="note")
    step(role="tool", tool_call_id="c3", name="profile", content="r3")
    step(role="tool", tool_call_id="c1", name="profile", content="", error="bad args")
    step(role="tool", tool_call_id="unknown", name="profile", content="to the last turn")
    step(role="tool", tool_call_id="c2", name="made_up_tool", content="r2")
    step(role="assistant", content="done", prompt_tokens=5)
    store.close()
    store = open_store(tmp_path / "edge.db", readonly=True)
    for fmt in (ExportFormat.OPENAI_SFT, ExportFormat.RL):
        fast, slow = _both(load_run(store, run), fmt, RewardWeights())
        assert fast == slow
    messages = fast["prompt"] + fast["completion"]
    assert [m["content"] for m in messages][:5] == [
        "before any call",
        "sys",
        "go",
        "orphan error",
        "a1",
    ]


@pytest.mark.parametrize(
    "raw, text",
    [("", "{}"), (" \n", "{}"), ('{"a":1}', '{"a":1}'), ("[1]", "[1]"), ('{"a": ', '{"a": ')],
)
def test_arguments_text(raw: str, text: str) -> None:
    assert arguments_text(raw) == text


def test_bulk_reads_equal_per_run_reads(fx: Fixture) -> None:
    from infra_agent.store.base import BulkReads
    from infra_agent.trajectories.build import load_runs

    store = open_store(fx.db, readonly=True)
    assert isinstance(store, BulkReads)
    runs = list(store.iter_runs())
    ids = [r.id for r in runs] + ["no-such-run"]
    assert store.steps_of_runs(ids) == {r.id: store.steps(r.id) for r in runs if store.steps(r.id)}
    assert store.experiments_of_runs(ids) == {r.id: store.experiments(r.id) for r in runs}
    patch_ids = ["a" * 64, "e" * 64, "0" * 64]
    assert store.patches_by_id(patch_ids) == {
        i: p for i in patch_ids if (p := store.get_patch(i)) is not None
    }
    review = ReviewIndex(store)
    assert load_runs(store, runs, review) == [load_run(store, r) for r in runs]
