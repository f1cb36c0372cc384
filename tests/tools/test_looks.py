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
