"""run_experiment(extend=...) in the loop (issue 34 item 9): an underpowered NO_CHANGE of this run
gets more pairs on its own patch, counted as one experiment, and the answer says from how many
pairs; extending it twice, or a run's decided verdict, is refused in one line. The fast
pure-Python test task through the real cascade, on a real store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from experiment_node import PYTASK, answer, loop_context, propose_blank_line
from recorded_samples import script_timing

from infra_agent.agent.configuration import AgentContext
from infra_agent.agent.state import AgentState, ExperimentOutcome
from infra_agent.experiments import run_experiment
from infra_agent.store.records import ToolCall
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.patch import Patch


def _call(k: int, **arguments: str) -> ToolCall:
    return ToolCall(id=f"x{k}", name="run_experiment", arguments=json.dumps(arguments))


def _answer(ctx: AgentContext, state: AgentState, call: ToolCall) -> tuple[AgentState, str]:
    state = answer(ctx, state, call)
    return state, state.messages[-1].content


def test_an_underpowered_verdict_is_extended_once_on_its_own_patch(tmp_path: Path) -> None:
    script_timing(shutil.copytree(PYTASK, tmp_path / "pytask"))  # no verdict hangs on the load
    task = load_task(tmp_path / "pytask")
    ctx = loop_context(task, tmp_path)
    store, tool_context, run_id = ctx.store, ctx.tool_context, ctx.tool_context.run_id
    assert "give either patch_id" in str(ctx.tools.parse("run_experiment", "{}"))
    patch_id = propose_blank_line(ctx)
    # The model cannot ask for a resolution: an earlier experiment asked to see 5.1% (minimum
    # effect 5%), which no budget resolves, so it is an underpowered NO_CHANGE.
    patch = tool_context.patch(patch_id)
    assert isinstance(patch, Patch)
    first = run_experiment(task, patch, store=store, run_id=run_id, detect=0.051)
    assert first.result.verdict is Verdict.NO_CHANGE and Flag.UNDERPOWERED in first.result.flags
    state = AgentState(run_id=run_id, patches=[patch_id],
                       experiments=[ExperimentOutcome.of(first, store.get_patch(patch_id), reused=False)])  # fmt: skip

    state, text = _answer(ctx, state, _call(1, patch_id=patch_id))
    assert text.startswith(f"already measured in this run ({first.id})"), text
    state, text = _answer(ctx, state, _call(2, extend=first.id))
    pairs = first.result.evidence.performance.n_samples  # type: ignore[union-attr]
    later = state.experiments[-1]
    assert text.startswith(f"experiment {later.experiment_id} on patch {patch_id[:12]}: "), text
    assert (
        f"{pairs} of them reused from {first.id} (extended); sampling stopped at "
        in text.splitlines()[0]
    ), text
    assert later.patch_id == patch_id and state.usage.experiments == 1
    state, text = _answer(ctx, state, _call(3, extend=first.id))
    assert text.startswith(f"error: not extended: {first.id} was extended already, by {later.experiment_id}")  # fmt: skip
    assert state.usage.experiments == 1 and len(store.experiments(run_id)) == 2
