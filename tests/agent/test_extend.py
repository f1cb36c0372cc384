"""run_experiment(extend=...) in the loop (issue 34 item 9): an underpowered NO_CHANGE of this run
gets more pairs on its own patch, counted as one experiment, and the answer says from how many
pairs; extending it twice, or a run's decided verdict, is refused in one line. The fast
pure-Python test task through the real cascade, on a real store."""

from __future__ import annotations

import difflib
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

from recorded_samples import script_timing

from infra_agent.agent.configuration import AgentContext, RunConfig
from infra_agent.agent.graph import experiment
from infra_agent.agent.runlog import RunLog
from infra_agent.agent.state import AgentState, Budget, ExperimentOutcome
from infra_agent.experiments import run_experiment
from infra_agent.store import open_store
from infra_agent.store.records import RunRecord, ToolCall
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.patch import Patch
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

PYTASK = Path(__file__).parents[1] / "experiments" / "pytask"


def _call(k: int, **arguments: str) -> ToolCall:
    return ToolCall(id=f"x{k}", name="run_experiment", arguments=json.dumps(arguments))


def _answer(ctx: AgentContext, state: AgentState, call: ToolCall) -> tuple[AgentState, str]:
    state = AgentState(**{**state.__dict__, "pending": [call]})
    update = experiment(state, SimpleNamespace(context=ctx))  # type: ignore[arg-type]
    state = AgentState(**{**state.__dict__, **update})
    return state, state.messages[-1].content


def test_an_underpowered_verdict_is_extended_once_on_its_own_patch(tmp_path: Path) -> None:
    script_timing(shutil.copytree(PYTASK, tmp_path / "pytask"))  # no verdict hangs on the load
    task = load_task(tmp_path / "pytask")
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task=task.name, objective="latency", policy="scripted")
    store.put_run(run)
    tool_context = ToolContext(task=task, store=store, run_id=run.id)
    ctx = AgentContext(
        config=RunConfig(task=task.name, policy="scripted", budget=Budget(experiments=4)),
        task=task, store=store, policy=SimpleNamespace(name="scripted", model=None),  # type: ignore[arg-type]
        tools=default_registry(), tool_context=tool_context, log=RunLog(store, run.id),
        run_experiment=run_experiment, executor=None,
    )  # fmt: skip
    assert "give either patch_id" in str(ctx.tools.parse("run_experiment", "{}"))
    source = (task.workspace / "kernel.py").read_text().splitlines(keepends=True)
    diff = "".join(difflib.unified_diff(source, [*source, "\n"], "a/kernel.py", "b/kernel.py"))
    proposed = ctx.tools.call("propose_patch", json.dumps({"diff": diff, "rationale": "A/A"}), tool_context)  # fmt: skip
    assert proposed.data is not None, proposed.content
    patch_id = proposed.data["patch_id"]
    # The model cannot ask for a resolution: an earlier experiment asked to see 5.1% (minimum
    # effect 5%), which no budget resolves, so it is an underpowered NO_CHANGE.
    patch = tool_context.patch(patch_id)
    assert isinstance(patch, Patch)
    first = run_experiment(task, patch, store=store, run_id=run.id, detect=0.051)
    assert first.result.verdict is Verdict.NO_CHANGE and Flag.UNDERPOWERED in first.result.flags
    state = AgentState(run_id=run.id, patches=[patch_id],
                       experiments=[ExperimentOutcome.of(first, store.get_patch(patch_id), reused=False)])  # fmt: skip

    state, text = _answer(ctx, state, _call(1, patch_id=patch_id))
    assert text.startswith(f"already measured in this run ({first.id})"), text
    state, text = _answer(ctx, state, _call(2, extend=first.id))
    pairs = first.result.evidence.performance.n_samples  # type: ignore[union-attr]
    later = state.experiments[-1]
    assert text.startswith(f"experiment {later.experiment_id} on patch {patch_id[:12]}: "), text
    assert f"extended: {pairs} of them from {first.id})" in text.splitlines()[0], text
    assert later.patch_id == patch_id and state.usage.experiments == 1
    state, text = _answer(ctx, state, _call(3, extend=first.id))
    assert text.startswith(f"error: not extended: {first.id} was extended already, by {later.experiment_id}")  # fmt: skip
    assert state.usage.experiments == 1 and len(store.experiments(run.id)) == 2
