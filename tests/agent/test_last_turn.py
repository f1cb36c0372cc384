"""Honest budget bookkeeping: the budget line after an experiment counts that experiment's time,
and when a budget runs out the policy gets exactly one last reply, offered only `finish`, in which
it sees the final result and writes its summary."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from infra_agent.agent.configuration import AgentContext, RunConfig
from infra_agent.agent.graph import experiment
from infra_agent.agent.policies.base import ModelTurn
from infra_agent.agent.policies.scripted import ScriptedPolicy
from infra_agent.agent.runlog import RunLog
from infra_agent.agent.runner import start_run
from infra_agent.agent.state import AgentState, Budget
from infra_agent.config import load_settings
from infra_agent.store import open_store
from infra_agent.store.records import ExperimentRecord, RunRecord, ToolCall
from infra_agent.store.verdict import ExperimentResult, Verdict
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

Seen = list[tuple[list[str], list[str]]]
"""Per reply asked for: the tool names offered, and the conversation's message contents."""


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """What the scripted policy was offered and shown on each turn."""
    calls: Seen = []
    replay = ScriptedPolicy.next_turn

    def recording(
        self: ScriptedPolicy, state: AgentState, tools: list[dict[str, Any]]
    ) -> ModelTurn:
        calls.append(([t["function"]["name"] for t in tools], [m.content for m in state.messages]))
        return replay(self, state, tools)

    monkeypatch.setattr(ScriptedPolicy, "next_turn", recording)
    return calls


def _run(tmp_path: Path, replies: list[dict[str, Any]], budget: Budget, task: str = "decode-split-norm") -> Any:  # fmt: skip
    script = tmp_path / "script.json"
    script.write_text(json.dumps(replies))
    settings = load_settings(overrides={"store.db": str(tmp_path / "runs.db")})
    config = RunConfig(task=task, policy="scripted", script=str(script), budget=budget)
    return start_run(config, settings)


def _assistant_calls(db: Path, run_id: str) -> list[list[str]]:
    store = open_store(db)
    try:
        steps = store.steps(run_id)
    finally:
        store.close()
    return [[c.name for c in s.tool_calls] for s in steps if s.role == "assistant"]


READ = {"tool_calls": [{"name": "read_file", "arguments": {"path": "attention.py"}}]}
LIST = {"tool_calls": [{"name": "list_files", "arguments": {}}]}


def test_a_used_up_turn_budget_leaves_one_reply_that_may_only_finish(
    tmp_path: Path, seen: Seen
) -> None:
    finish = {"tool_calls": [{"name": "read_file", "arguments": {"path": "attention.py"}},
                             {"name": "finish", "arguments": {"summary": "nothing proven; try hoisting"}}]}  # fmt: skip
    outcome = _run(tmp_path, [READ, LIST, finish, LIST], Budget(turns=2))

    assert len(seen) == 3  # two replies within the budget, exactly one more
    assert "finish" in seen[0][0] and len(seen[0][0]) > 1
    assert seen[2][0] == ["finish"]
    last_note = seen[2][1][-1]
    assert "budget is used up (turn budget used (2/2))" in last_note and "finish" in last_note
    assert outcome.stop_reason == "the scripted policy called finish"
    store = open_store(tmp_path / "runs.db")
    steps = store.steps(outcome.run_id)
    run = store.get_run(outcome.run_id)
    store.close()
    refused = [s for s in steps if s.role == "tool" and s.error and "only finish" in s.error]
    assert [s.name for s in refused] == ["read_file"]  # the last reply's other call is not run
    assert run is not None and run.status.value == "finished"


def test_a_last_reply_without_finish_ends_the_run_as_before(tmp_path: Path, seen: Seen) -> None:
    outcome = _run(tmp_path, [READ, LIST, {"content": "done"}, LIST, LIST], Budget(turns=2))

    assert len(seen) == 3 and seen[2][0] == ["finish"]
    assert outcome.stop_reason == "turn budget used (3/2)"
    assert _assistant_calls(tmp_path / "runs.db", outcome.run_id) == [["read_file"], ["list_files"], []]  # fmt: skip
    store = open_store(tmp_path / "runs.db")
    *_, note = [s for s in store.steps(outcome.run_id) if s.role == "user"]
    store.close()
    assert note.error is not None and "at least one of the tools (finish)" in note.error


def test_the_search_policy_finishes_in_its_last_reply(tmp_path: Path) -> None:
    settings = load_settings(overrides={"store.db": str(tmp_path / "runs.db")})
    config = RunConfig(task="decode-split-norm", policy="search", budget=Budget(experiments=0))
    outcome = start_run(config, settings)
    assert outcome.stop_reason == "the search policy called finish"
    calls = _assistant_calls(tmp_path / "runs.db", outcome.run_id)
    assert calls == [["propose_knobs", "run_experiment"], ["finish"]]


@pytest.mark.slow
def test_the_last_experiment_is_seen_and_summarized(quick_task: Path, tmp_path: Path, seen: Seen) -> None:  # fmt: skip
    """The run used to stop on 'experiment budget used' right after its last experiment: the
    model never saw that result and never wrote its summary."""
    replies = [
        {
            "tool_calls": [
                {
                    "name": "propose_knobs",
                    "arguments": {"knobs": {"num_splits": 2}, "rationale": "fewer passes"},
                }
            ]
        },  # fmt: skip
        {
            "tool_calls": [
                {"name": "run_experiment", "arguments": {"patch_id": "{{last_patch_id}}"}}
            ]
        },  # fmt: skip
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "num_splits=2 measured"}}]},
    ]
    outcome = _run(tmp_path, replies, Budget(experiments=1, turns=10), task=str(quick_task))

    assert len(outcome.experiments) == 1 and len(seen) == 3
    offered, shown = seen[2]
    assert offered == ["finish"]
    verdict = outcome.experiments[0].verdict.value
    assert any(text.startswith("experiment ") and verdict in text for text in shown)
    assert "experiments 1/1" in next(t for t in shown if t.startswith("experiment "))
    assert outcome.stop_reason == "the scripted policy called finish"


def test_the_budget_line_after_an_experiment_counts_its_time(tmp_path: Path) -> None:
    """The line used to show the wall time left before the experiment started."""
    task = find_task("decode-split-norm")
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task=task.name, objective="latency", policy="scripted")
    store.put_run(run)
    tool_context = ToolContext(task=task, store=store, run_id=run.id)

    def slow_experiment(task: Any, patch: Any, **kw: Any) -> ExperimentRecord:
        time.sleep(2.5)
        result = ExperimentResult(task=task.name, patch_id=patch.hash, verdict=Verdict.NO_CHANGE, reasons=["noise"])  # fmt: skip
        record = ExperimentRecord(run_id=run.id, task=task.name, patch_id=patch.hash, result=result)
        store.put_experiment(record)
        return record

    ctx = AgentContext(
        config=RunConfig(task=task.name, policy="scripted", budget=Budget(wall_s=100.0)),
        task=task, store=store, policy=SimpleNamespace(name="scripted", model=None),  # type: ignore[arg-type]
        tools=default_registry(), tool_context=tool_context, log=RunLog(store, run.id),
        run_experiment=slow_experiment,
    )  # fmt: skip
    proposed = ctx.tools.call("propose_knobs", json.dumps({"knobs": {"num_splits": 2}, "rationale": "r"}), tool_context)  # fmt: skip
    assert proposed.data is not None, proposed.content
    patch_id = proposed.data["patch_id"]
    call = ToolCall(id="x", name="run_experiment", arguments=json.dumps({"patch_id": patch_id}))
    state = AgentState(run_id=run.id, pending=[call], patches=[patch_id])
    update = experiment(state, SimpleNamespace(context=ctx))  # type: ignore[arg-type]
    store.close()

    [answer] = [m.content for m in update["messages"] if m.role == "tool"]
    used_s = float(answer.split(", time ")[1].split("/")[0])
    assert used_s >= 2.5 - 0.5, answer
    assert update["usage"].wall_s >= 2.5


def test_the_budget_line_after_a_slow_tool_counts_its_time(tmp_path: Path) -> None:
    """A server instrument can take minutes: the reply's budget line counts them."""
    from pydantic import BaseModel

    from infra_agent.agent.graph import tools
    from infra_agent.tools.base import ToolRegistry, ToolResult, tool

    class NoParams(BaseModel):
        pass

    @tool("slow_look", "Takes a while.", NoParams)
    def slow_look(p: NoParams, ctx: Any) -> ToolResult:
        time.sleep(1.5)
        return ToolResult(content="looked")

    task = find_task("decode-split-norm")
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task=task.name, objective="latency", policy="scripted")
    store.put_run(run)
    ctx = AgentContext(
        config=RunConfig(task=task.name, policy="scripted", budget=Budget(wall_s=100.0)),
        task=task, store=store, policy=SimpleNamespace(name="scripted", model=None),  # type: ignore[arg-type]
        tools=ToolRegistry([slow_look]), tool_context=ToolContext(task=task, store=store, run_id=run.id),
        log=RunLog(store, run.id), run_experiment=lambda *a, **kw: None,  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    state = AgentState(run_id=run.id, pending=[ToolCall(id="y", name="slow_look", arguments="{}")])
    update = tools(state, SimpleNamespace(context=ctx))  # type: ignore[arg-type]
    store.close()

    [answer] = [m.content for m in update["messages"] if m.role == "tool"]
    assert answer.startswith("looked\n[budget used: replies 0/40, ")
    assert float(answer.split(", time ")[1].split("/")[0]) >= 1.0, answer
