"""A FAILED verdict whose baseline arm failed says nothing about the patch (a relay run lost an
experiment and a cosmetic re-patch to a baseline server killed on a loaded machine): the
cascade flags it `baseline_failed`, the experiment is not charged to the budget, and asked again
for the same patch the loop measures it again instead of answering from the record. The fast pure-Python test task through the real
cascade and the real experiment node, on a real store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from experiment_node import PYTASK, answer, loop_context, propose_blank_line
from recorded_samples import script_timing

from infra_agent.agent.configuration import AgentContext
from infra_agent.agent.state import AgentState
from infra_agent.store.records import ToolCall
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.manifest import Task, load_task


def _answer(ctx: AgentContext, state: AgentState, patch_id: str, k: int) -> AgentState:
    call = ToolCall(id=f"x{k}", name="run_experiment", arguments=json.dumps({"patch_id": patch_id}))
    return answer(ctx, state, call)


def _breaking(tmp_path: Path, arm: str, flag: Path, error: str) -> Task:
    """The test task, its verdicts from scripted timings (no hang on the load), whose `arm`
    raises `error` in prepare while `flag` exists (created here)."""
    root = shutil.copytree(PYTASK, tmp_path / "pytask")
    script_timing(root)
    flag.touch()
    harness = root / "harness.py"
    hook = "    def prepare(self, arm: Arm) -> None:\n"
    harness.write_text(harness.read_text().replace(hook, hook + (
        f"        if arm.name == {arm!r} and __import__('os').path.exists({str(flag)!r}):\n"
        f"            raise {error}\n"
    )))  # fmt: skip
    return load_task(root)


def test_a_patch_whose_baseline_failed_is_measured_again(tmp_path: Path) -> None:
    broken = tmp_path / "baseline-breaks"
    task = _breaking(tmp_path, "baseline", broken, "RuntimeError('server exited with status 137 before it was ready')")  # fmt: skip
    ctx = loop_context(task, tmp_path)
    store, run_id = ctx.store, ctx.tool_context.run_id
    patch_id = propose_blank_line(ctx)

    state = _answer(ctx, AgentState(run_id=run_id, patches=[patch_id]), patch_id, 1)
    (first,) = state.experiments
    assert first.verdict is Verdict.FAILED and Flag.BASELINE_FAILED in first.flags
    assert (
        "baseline failed" in state.messages[-1].content
        and "status 137" in state.messages[-1].content
        and "Not charged to the experiment budget" in state.messages[-1].content
    )
    assert state.usage.experiments == 0

    broken.unlink()
    state = _answer(ctx, state, patch_id, 2)
    assert "already measured" not in state.messages[-1].content, state.messages[-1].content
    second = state.experiments[-1]
    assert second.experiment_id != first.experiment_id and second.patch_id == patch_id
    assert second.verdict is Verdict.NO_CHANGE and Flag.BASELINE_FAILED not in second.flags
    assert "Not charged" not in state.messages[-1].content
    assert state.usage.experiments == 1 and len(store.experiments(run_id)) == 2


def test_a_failed_candidate_run_is_charged_and_may_be_run_again(tmp_path: Path) -> None:
    """A harness error while running the candidate (a relay run's ReadTimeout on a loaded
    machine) measured nothing either: it costs its experiment, but asking again measures the
    patch instead of answering 'already measured ... FAILED; not re-run' (which had pushed the
    model to write a cosmetically different patch)."""
    broken = tmp_path / "candidate-breaks"
    ctx = loop_context(
        _breaking(tmp_path, "candidate", broken, "TimeoutError('timed out')"), tmp_path
    )
    patch_id = propose_blank_line(ctx)
    state = _answer(
        ctx, AgentState(run_id=ctx.tool_context.run_id, patches=[patch_id]), patch_id, 1
    )
    (first,) = state.experiments
    assert first.verdict is Verdict.FAILED and Flag.BASELINE_FAILED not in first.flags
    assert "this patch may be run again" in state.messages[-1].content
    assert state.usage.experiments == 1
    broken.unlink()
    state = _answer(ctx, state, patch_id, 2)
    assert "already measured" not in state.messages[-1].content
    assert state.experiments[-1].verdict is Verdict.NO_CHANGE and state.usage.experiments == 2
