"""The looks budget without a server: a spent budget and a knob the task lacks are refused in one
line before any server starts, and the budget line names the looks budget only where the run
offers looks (the live looks on a patched server: test_looks_live.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra_agent.agent.state import Budget, Usage
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools import looks
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry


def test_a_spent_looks_budget_and_an_unknown_knob_are_refused_before_a_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Any] = []
    monkeypatch.setattr(looks, "start_look_server", lambda *a: started.append(a))
    ctx = ToolContext(
        task=find_task("sglang-slow-decode"), store=open_store(tmp_path / "r.db"), run_id="r"
    )
    reg = default_registry()
    ctx.looks_used, ctx.looks_limit = 4, 4
    for name in sorted(looks.LOOK_TOOLS):
        spent = reg.call(name, "{}", ctx)
        assert spent.error is not None and "\n" not in spent.error, spent.error
        assert spent.error.startswith(f"{name}: looks budget spent (4/4)"), spent.error
    ctx.looks_limit = None
    knob = reg.call("serving_workload", json.dumps({"knobs": {"max-running-requests": 8}}), ctx)
    assert knob.error == (
        "serving_workload: unknown knob 'max-running-requests' for task sglang-slow-decode "
        "(knobs: none)"
    )
    assert started == [] and ctx.looks_used == 4  # nothing started, no look counted


def test_the_budget_line_names_the_looks_budget_and_says_a_spent_one_ends_no_run() -> None:
    line = Usage(looks=13).budget_line(Budget(looks=16))
    assert line.startswith("[budget used: ") and ", looks 13/16]" in line
    assert "looks 81% used (past 75%; 3 left)" in line
    assert "Looks spent are refused; the run goes on." in line
    assert "The run stops" not in line  # no budget that ends the run is near its end
    assert "looks" not in Usage().budget_line(Budget(looks=0))  # a run that offers no look


def test_the_graph_counts_looks_in_its_state_and_the_budget_line_shows_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three looks in one reply against a looks budget of 2: two run (on one kept stand-in
    server), the third is refused, the reply's budget line reads 'looks 2/2' and says the run
    goes on; the count lives in the graph's state, so the next reply's look is refused too."""
    from types import SimpleNamespace

    from infra_agent.agent.configuration import AgentContext, RunConfig
    from infra_agent.agent.graph import tools
    from infra_agent.agent.runlog import RunLog
    from infra_agent.agent.state import AgentState
    from infra_agent.sandboxes.fileview import FileView
    from infra_agent.sandboxes.netns import Network
    from infra_agent.serving.load.generator import WorkloadResult
    from infra_agent.store.records import RunRecord, ToolCall

    class StandIn:
        network = Network(mode="host", reason="stand-in")
        filesystem = FileView(mode="host", reason="stand-in")

        def call(self, fn: Any, sessions: Any, load: Any) -> WorkloadResult:
            return WorkloadResult(records=[], duration_s=1.0, load=load)

        def cpu_seconds(self) -> float:
            return 0.0

    class Kept:
        start_s = 2.0
        started_as = ["prefix cache class UnifiedRadixCache (default choice)"]

        def running(self) -> Any:
            from contextlib import nullcontext

            return nullcontext(StandIn())

        def alive(self) -> bool:
            return True

        def close(self) -> None:
            return None

    starts: list[Any] = []
    monkeypatch.setattr(looks, "start_look_server", lambda *a: starts.append(a) or Kept())
    task = find_task("sglang-slow-decode")
    store = open_store(tmp_path / "runs.db")
    run = RunRecord(task=task.name, objective="throughput", policy="scripted")
    store.put_run(run)
    ctx = AgentContext(
        config=RunConfig(task=task.name, policy="scripted", budget=Budget(looks=2)),
        task=task, store=store, policy=SimpleNamespace(name="scripted", model=None),  # type: ignore[arg-type]
        tools=default_registry("dense", task), tool_context=ToolContext(task=task, store=store, run_id=run.id),
        log=RunLog(store, run.id), run_experiment=lambda *a, **kw: None,  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    calls = [ToolCall(id=str(i), name="serving_workload", arguments="{}") for i in range(3)]
    update = tools(AgentState(run_id=run.id, pending=calls), SimpleNamespace(context=ctx))  # type: ignore[arg-type]
    first, second, third = [m.content for m in update["messages"] if m.role == "tool"]
    assert "look 1/2 at baseline (one run on one server, not a verdict" in first
    assert "look 2/2 at baseline" in second and "server reused" in second
    assert third.startswith("error: serving_workload: looks budget spent (2/2)")
    assert ", looks 2/2]" in third and "Looks spent are refused; the run goes on." in third
    assert update["usage"].looks == 2 and len(starts) == 1
    again = AgentState(run_id=run.id, usage=update["usage"], pending=calls[:1])
    later = tools(again, SimpleNamespace(context=ctx))  # type: ignore[arg-type]
    [refused] = [m.content for m in later["messages"] if m.role == "tool"]
    assert refused.startswith("error: serving_workload: looks budget spent (2/2)")
    ctx.tool_context.close()
    store.close()


def test_the_system_prompt_tells_of_looks_only_where_the_run_offers_them() -> None:
    from infra_agent.agent.prompts import system_prompt

    serving = find_task("sglang-slow-decode")
    dense = system_prompt(default_registry("dense", serving))
    assert "server_profile, server_steps, serving_workload take any patch_id" in dense
    assert "not a verdict; looks have a budget of their own" in dense
    assert "take any patch_id" not in system_prompt(default_registry("sparse", serving))
    kernel = find_task("decode-split-norm")
    assert "take any patch_id" not in system_prompt(default_registry("dense", kernel))


def test_kept_servers_give_way_least_recently_used_first_when_memory_is_short() -> None:
    """Paused look servers hold their memory: a start (or an experiment's two) that would not fit
    stops the least recently used ones first, and only while memory is short."""
    from infra_agent.tools.kept_servers import SERVER_MEMORY, KeptServers

    class Fake:
        def __init__(self, name: str) -> None:
            self.name, self.closed = name, False

        def alive(self) -> bool:
            return not self.closed

        def close(self) -> None:
            self.closed = True
            state["free"] += SERVER_MEMORY

    state = {"free": 10 * SERVER_MEMORY}
    kept: KeptServers[Fake] = KeptServers(memory=lambda: state["free"])

    def start(name: str) -> Fake:
        state["free"] -= SERVER_MEMORY
        return Fake(name)

    a, _ = kept.get("a", lambda: start("a"))
    b, _ = kept.get("b", lambda: start("b"))
    kept.get("a", lambda: start("a"))  # a is used again: b is now the least recent
    assert kept.make_room(2 * SERVER_MEMORY) == 0 and not a.closed and not b.closed
    state["free"] = SERVER_MEMORY // 2  # other work took the memory
    c, reused = kept.get("c", lambda: start("c"))
    assert not reused and b.closed and not a.closed  # one stop was enough for one start
    state["free"] = 0
    assert kept.make_room(2 * SERVER_MEMORY) == 2 and a.closed and c.closed
    assert kept.servers == {}
    assert KeptServers(memory=lambda: None).make_room(SERVER_MEMORY) == 0  # unknown: none stop
