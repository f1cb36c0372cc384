"""The loop's own decisions, node by node on a real store, task and executor: every experiment
path stops at every budget, and the best IMPROVED patch is the one submitted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra_agent.agent.configuration import AgentContext, RunConfig
from infra_agent.agent.graph import experiment
from infra_agent.agent.handoff import best_improved
from infra_agent.agent.runlog import RunLog
from infra_agent.agent.state import AgentState, Budget, ExperimentOutcome, Usage
from infra_agent.experiments import run_experiment
from infra_agent.experiments.executors import create_executor
from infra_agent.store import open_store
from infra_agent.store.records import ExperimentRecord, RunRecord, ToolCall
from infra_agent.store.verdict import ExperimentResult, Verdict
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

BUDGET = Budget(experiments=4, wall_s=60.0, tokens=1000, cost_usd=1.0, turns=10)
SPENT = {
    "experiment": Usage(experiments=4),
    "wall-time": Usage(wall_s=60.0),
    "token": Usage(tokens=1000),
    "cost": Usage(cost_usd=1.0),
    "turn": Usage(turns=10),
}


@pytest.fixture(params=[None, "local"], ids=["one at a time", "parallel executor"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AgentContext]:
    task = find_task("decode-split-norm")
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task=task.name, objective="latency", policy="scripted")
    store.put_run(run)
    config = RunConfig(task=task.name, policy="scripted", budget=BUDGET, executor=request.param)
    executor = create_executor("local", parallel=2) if request.param else None
    tool_context = ToolContext(task=task, store=store, run_id=run.id)
    yield AgentContext(
        config=config, task=task, store=store, policy=SimpleNamespace(name="scripted", model=None),  # type: ignore[arg-type]
        tools=default_registry(), tool_context=tool_context, log=RunLog(store, run.id),
        run_experiment=run_experiment, executor=executor,
    )  # fmt: skip
    if executor is not None:
        executor.shutdown()


def _patches(ctx: AgentContext, n: int) -> list[str]:
    ids = []
    for k in range(n):
        arguments = json.dumps({"knobs": {"num_splits": 2 + k}, "rationale": "fewer splits"})
        result = ctx.tools.call("propose_knobs", arguments, ctx.tool_context)
        assert result.data is not None, result.content
        ids.append(result.data["patch_id"])
    return ids


def _pending(ids: list[str]) -> list[ToolCall]:
    return [
        ToolCall(id=f"x{k}", name="run_experiment", arguments=json.dumps({"patch_id": i}))
        for k, i in enumerate(ids)
    ]


def _step(ctx: AgentContext, state: AgentState) -> dict[str, Any]:
    return experiment(state, SimpleNamespace(context=ctx))  # type: ignore[arg-type]


@pytest.mark.parametrize("spent", list(SPENT), ids=list(SPENT))
def test_every_experiment_path_stops_at_every_budget(ctx: AgentContext, spent: str) -> None:
    """Once any budget is used up nothing more runs, one at a time or in a parallel batch (the
    parallel path used to check only the experiment count)."""
    ids = _patches(ctx, 2)
    state = AgentState(run_id=ctx.tool_context.run_id, pending=_pending(ids), patches=ids,
                       usage=SPENT[spent].model_copy())  # fmt: skip
    while state.pending:
        update = _step(ctx, state)
        state = AgentState(**{**state.__dict__, **update})
    answers = [m for m in state.messages if m.role == "tool"]
    assert len(answers) == 2
    assert all(m.content.startswith(f"error: not run: {spent} budget used") for m in answers)
    assert state.experiments == [] and ctx.store.experiments(state.run_id) == []
    assert state.usage.experiments == SPENT[spent].experiments


def test_a_batch_is_admitted_within_the_experiment_count(ctx: AgentContext) -> None:
    """Two patches measured before a crash (stored, not yet in the checkpoint) are read back, not
    re-run; with one experiment left only the first is admitted."""
    ids = _patches(ctx, 2)
    for patch_id in ids:
        result = ExperimentResult(task=ctx.task.name, patch_id=patch_id, verdict=Verdict.NO_CHANGE, reasons=["noise"])  # fmt: skip
        ctx.store.put_experiment(ExperimentRecord(run_id=ctx.tool_context.run_id, task=ctx.task.name,
                                                  patch_id=patch_id, result=result))  # fmt: skip
    state = AgentState(run_id=ctx.tool_context.run_id, pending=_pending(ids), patches=ids,
                       usage=Usage(experiments=BUDGET.experiments - 1))  # fmt: skip
    while state.pending:
        state = AgentState(**{**state.__dict__, **_step(ctx, state)})
    assert [e.patch_id for e in state.experiments] == ids[:1] and state.experiments[0].reused
    answers = [m.content for m in state.messages]
    assert "NO_CHANGE" in answers[0] and "[budget" not in answers[0]  # one line per reply, last
    refused, line, warning = answers[1].split("\n")
    assert refused == "error: not run: experiment budget used (4/4)"
    assert line.startswith("[budget used: replies 0/") and "experiments 4/4" in line
    assert warning.startswith("[budget warning: experiments 100% used (past 90%; none left)")
    assert state.usage.experiments == BUDGET.experiments


def _outcome(k: int, verdict: Verdict, speedup: float | None) -> ExperimentOutcome:
    ci = (speedup - 0.1, speedup + 0.1) if speedup is not None else (None, None)
    return ExperimentOutcome(experiment_id=f"exp-{k}", patch_id=f"patch-{k}", patch_summary=f"p{k}",
                             verdict=verdict, speedup=speedup, ci_low=ci[0], ci_high=ci[1])  # fmt: skip


def test_the_best_improved_patch_is_the_best_proven_one() -> None:
    """Only IMPROVED counts (not a faster NO_CHANGE, REGRESSED or INCORRECT, nor one without a
    speedup); the best of them wins wherever it stands; a tie goes to the earliest."""
    experiments = [
        _outcome(0, Verdict.IMPROVED, 1.2),
        _outcome(1, Verdict.NO_CHANGE, 3.0),
        _outcome(2, Verdict.IMPROVED, 1.5),
        _outcome(3, Verdict.REGRESSED, 2.5),
        _outcome(4, Verdict.IMPROVED, 1.3),
        _outcome(5, Verdict.IMPROVED, None),
        _outcome(6, Verdict.IMPROVED, 1.5),
        _outcome(7, Verdict.INCORRECT, 4.0),
    ]
    best = best_improved(AgentState(experiments=experiments))
    assert best is not None and best.experiment_id == "exp-2"
    only_worse = [e for e in experiments if e.verdict is not Verdict.IMPROVED]
    assert best_improved(AgentState(experiments=only_worse)) is None
    assert best_improved(AgentState()) is None
    before_tie = best_improved(AgentState(experiments=experiments[:5]))
    assert before_tie is not None and before_tie.experiment_id == "exp-2"
