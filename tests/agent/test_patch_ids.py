"""A patch id's first characters name it (a relay run: 'patch id is a 64-hex string, long to
copy'): run_experiment and the tools take a unique prefix of 8 or more characters of this run's
patch; a shorter or unknown one is refused as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from experiment_node import PYTASK, answer, loop_context, propose_blank_line
from recorded_samples import script_timing

from infra_agent.agent.state import AgentState
from infra_agent.errors import UserError
from infra_agent.store.records import ToolCall
from infra_agent.tasks.manifest import load_task


def test_run_experiment_takes_a_unique_prefix_of_a_patch_id(tmp_path: Path) -> None:
    root = shutil.copytree(PYTASK, tmp_path / "pytask")
    script_timing(root)
    ctx = loop_context(load_task(root), tmp_path)
    patch_id = propose_blank_line(ctx)
    tools = ctx.tool_context
    assert tools.patch(patch_id[:12]).hash == patch_id
    with pytest.raises(UserError, match="no patch with id"):
        tools.patch(patch_id[:6])  # too short to name a patch
    with pytest.raises(UserError, match="no patch with id"):
        tools.patch("0" * 12 if not patch_id.startswith("0") else "1" * 12)
    call = ToolCall(id="x1", name="run_experiment", arguments=json.dumps({"patch_id": patch_id[:12]}))  # fmt: skip
    state = answer(ctx, AgentState(run_id=tools.run_id, patches=[patch_id]), call)
    (done,) = state.experiments
    assert done.patch_id == patch_id and state.usage.experiments == 1
    again = ToolCall(id="x2", name="run_experiment", arguments=json.dumps({"patch_id": patch_id}))
    state = answer(ctx, state, again)
    assert "already measured in this run" in state.messages[-1].content
