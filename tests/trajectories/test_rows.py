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
from infra_agent.trajectories.build import (
    ReviewIndex,
    RunBundle,
    build_trajectory,
    load_run,
    load_runs,
)
from infra_agent.trajectories.formats import ExportFormat, rl_row, sft_row
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.rows import arguments_text, run_row
from infra_agent.trajectories.trusted import load_trusted_runs


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
    _assert_trusted_rows_identical(store)
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
    from infra_agent.store.base import BulkReads, TrustedBodies

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
    assert isinstance(store, TrustedBodies)
    assert store.step_bodies_of_runs(ids) == {
        r.id: [s.model_dump(mode="json") for s in store.steps(r.id)]
        for r in runs
        if store.steps(r.id)
    }
    assert store.experiment_bodies_of_runs(ids) == {
        r.id: [e.model_dump(mode="json") for e in store.experiments(r.id)] for r in runs
    }


def _assert_trusted_rows_identical(store: Any, weights: RewardWeights | None = None) -> None:
    """The rows from the store's trusted bodies (`trusted.load_trusted_runs`) are the rows from
    its validated records, byte for byte as JSON, with the same reward, verdicts and skip reason."""
    w = (weights or RewardWeights()).model_dump()
    runs = list(store.iter_runs())
    review = ReviewIndex(store)
    trusted = load_trusted_runs(store, runs, review)
    validated = load_runs(store, runs, review, patches=False)
    assert [b.run.id for b in trusted] == [b.run.id for b in validated]
    for t, v in zip(trusted, validated, strict=True):
        assert t.step_bodies is not None and not t.steps
        for fmt in (ExportFormat.OPENAI_SFT, ExportFormat.RL):
            a, b = run_row(t, fmt, w), run_row(v, fmt, w)
            assert json.dumps(a.row) == json.dumps(b.row), (t.run.id, fmt)
            assert (a.reward, a.verdicts, a.skip) == (b.reward, b.verdicts, b.skip)


@pytest.mark.parametrize("weights", [RewardWeights(), RewardWeights(review=3.0, failure=0.0)])
def test_trusted_rows_identical_to_validated_rows(fx: Fixture, weights: RewardWeights) -> None:
    _assert_trusted_rows_identical(open_store(fx.db, readonly=True), weights)


def test_trusted_rows_of_runs_without_steps_or_assistant(tmp_path: Path) -> None:
    """Runs that form no row keep their skip reason; an experiment recorded without the run id
    but named by a proposal still counts (read as a record)."""
    from infra_agent.experiments.verdict import ExperimentResult, Flag, Verdict
    from infra_agent.store.records import ExperimentRecord, ProposalRecord

    store = open_store(tmp_path / "s.db")
    empty = RunRecord(task="t", objective="latency", policy="llm")
    user_only = RunRecord(task="t", objective="latency", policy="llm")
    for run in (empty, user_only):
        store.put_run(run)
    store.add_step(StepRecord(run_id=user_only.id, role="user", content="hi", cost_usd=0.5))
    result = ExperimentResult(task="t", patch_id="p" * 64, verdict=Verdict.REJECTED,
                              reasons=["x"], flags=[Flag.SUSPICIOUS])  # fmt: skip
    loose = ExperimentRecord(run_id=None, task="t", patch_id="p" * 64, result=result)
    store.put_experiment(loose)
    store.put_proposal(ProposalRecord(run_id=user_only.id, task="t", patch_id="p" * 64,
                                      patch_hash="p" * 64, experiment_ids=[loose.id]))  # fmt: skip
    store.close()
    store = open_store(tmp_path / "s.db", readonly=True)
    _assert_trusted_rows_identical(store)
    review = ReviewIndex(store)
    skips = [run_row(b, ExportFormat.RL, RewardWeights().model_dump()).skip
             for b in load_trusted_runs(store, list(store.iter_runs()), review)]  # fmt: skip
    assert sorted(skips) == ["no assistant message", "no steps recorded"]


@pytest.mark.parametrize("fmt", [ExportFormat.OPENAI_SFT, ExportFormat.RL])
@pytest.mark.parametrize("parquet", [False, True])
def test_export_from_trusted_bodies_writes_the_same_bytes(
    fx: Fixture, tmp_path: Path, fmt: ExportFormat, parquet: bool
) -> None:
    from infra_agent.trajectories.export import export_dataset

    store = open_store(fx.db, readonly=True)
    fast, slow = tmp_path / "fast.out", tmp_path / "slow.out"
    a = export_dataset(store, fmt, fast, parquet=parquet)
    b = export_dataset(store, fmt, slow, parquet=parquet, trusted_bodies=False)
    assert fast.read_bytes() == slow.read_bytes()
    assert a.model_dump(exclude={"path", "seconds"}) == b.model_dump(exclude={"path", "seconds"})


def test_picked_fields_equal_the_parsed_bodies(fx: Fixture) -> None:
    """The store's picked fields give the views the whole parsed bodies give (experiments), and
    the fields the rows read of the validated proposals and decisions (review)."""
    from infra_agent.trajectories.trusted import (
        EXPERIMENT_PATHS,
        TrustedReview,
        picked_experiment,
        trusted_experiment,
    )

    store = open_store(fx.db, readonly=True)
    ids = [r.id for r in store.iter_runs()] + ["no-such-run"]
    picked = store.experiment_fields_of_runs(ids, EXPERIMENT_PATHS)
    whole = store.experiment_bodies_of_runs(ids)
    assert picked.keys() == whole.keys()
    views = {k: [picked_experiment(v) for v in vs] for k, vs in picked.items()}
    assert views == {k: [trusted_experiment(b) for b in bs] for k, bs in whole.items()}
    assert any(e.result.evidence.performance for vs in views.values() for e in vs)
    assert any(e.result.evidence.performance is None for vs in views.values() for e in vs)
    assert any(e.result.flags for vs in views.values() for e in vs)

    trusted, validated = TrustedReview(store), ReviewIndex(store)
    p_keys = ("id", "run_id", "patch_id", "patch_hash", "experiment_ids", "status")
    d_keys = ("proposal_id", "action", "patch_hash")

    def fields(index: dict[Any, list[Any]], keys: tuple[str, ...]) -> dict[Any, Any]:
        return {k: [tuple(getattr(x, f) for f in keys) for x in xs] for k, xs in index.items()}

    assert fields(trusted.proposals, p_keys) == fields(validated.proposals, p_keys)
    assert fields(trusted.decisions, d_keys) == fields(validated.decisions, d_keys)
    assert sum(map(len, trusted.decisions.values())) >= 2
    with pytest.raises(ValueError, match="two"):
        store.experiment_fields_of_runs(ids, ["$.id"])
