"""Test equipment: the agent's experiment node on the pure-Python test task, without a graph.

ctx = loop_context(task, tmp_path)             # a real store, run, tools and cascade
patch_id = propose_blank_line(ctx)             # an A/A patch (a blank line at the end)
state = answer(ctx, state, call)               # one run_experiment call through the node
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from types import SimpleNamespace

from infra_agent.agent.configuration import AgentContext, RunConfig
from infra_agent.agent.graph import experiment
from infra_agent.agent.runlog import RunLog
from infra_agent.agent.state import AgentState, Budget
from infra_agent.experiments import run_experiment
from infra_agent.store import open_store
from infra_agent.store.records import RunRecord, ToolCall
from infra_agent.tasks.manifest import Task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

PYTASK = Path(__file__).parent / "experiments" / "pytask"
"""The fast pure-Python test task (copy it before changing it)."""


def loop_context(task: Task, folder: Path) -> AgentContext:
    """The experiment node's context for a scripted run of `task`, its store in `folder`."""
    store = open_store(folder / "runs.db")
    run = RunRecord(task=task.name, objective="latency", policy="scripted")
    store.put_run(run)
    tool_context = ToolContext(task=task, store=store, run_id=run.id)
    return AgentContext(
        config=RunConfig(task=task.name, policy="scripted", budget=Budget(experiments=4)),
        task=task, store=store, policy=SimpleNamespace(name="scripted", model=None),  # type: ignore[arg-type]
        tools=default_registry(), tool_context=tool_context, log=RunLog(store, run.id),
        run_experiment=run_experiment, executor=None,
    )  # fmt: skip


def propose_blank_line(ctx: AgentContext) -> str:
    """Propose an A/A patch (a blank line after kernel.py) through the tool; its patch id."""
    source = (ctx.task.workspace / "kernel.py").read_text().splitlines(keepends=True)
    diff = "".join(difflib.unified_diff(source, [*source, "\n"], "a/kernel.py", "b/kernel.py"))
    args = json.dumps({"diff": diff, "rationale": "A/A"})
    proposed = ctx.tools.call("propose_patch", args, ctx.tool_context)
    assert proposed.data is not None, proposed.content
    return str(proposed.data["patch_id"])


def answer(ctx: AgentContext, state: AgentState, call: ToolCall) -> AgentState:
    """`state` after the experiment node answered `call` (its only pending call)."""
    state = AgentState(**{**state.__dict__, "pending": [call]})
    update = experiment(state, SimpleNamespace(context=ctx))  # type: ignore[arg-type]
    return AgentState(**{**state.__dict__, **update})
