"""Tools offered per task: a run offers only the tools that can work for its task, and
`infra-agent tools list` prints exactly those schemas."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel
from support import run_cli

from infra_agent.tasks.registry import find_task
from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.registry import default_registry

SERVING_TOOLS = {"serving_workload", "server_steps", "server_profile"}


def test_a_kernel_task_gets_no_serving_tools_and_a_knobless_task_no_propose_knobs() -> None:
    kernel = default_registry("dense", find_task("decode-split-norm")).names()
    assert "edit_file" in kernel and "propose_knobs" in kernel  # it has knobs
    assert "gil_trace" in kernel and not SERVING_TOOLS & set(kernel)
    gil = default_registry("dense", find_task("kv-transfer-gil")).names()
    assert "propose_knobs" not in gil and "edit_file" in gil  # no knobs, editable files
    serving = default_registry("dense", find_task("sglang-cpu-tiny")).names()
    assert SERVING_TOOLS <= set(serving) and "propose_knobs" in serving
    assert "gil_trace" not in serving  # it traces the task's own program
    assert set(default_registry().names()) >= set(serving) | set(kernel)  # no task: every tool
    sparse = default_registry("sparse", find_task("decode-split-norm")).names()
    assert "edit_file" in sparse and "microbench" not in sparse


def test_needs_is_one_checked_word() -> None:
    class P(BaseModel):
        pass

    @tool("stats", "Server step statistics.", P, needs="serving")
    def stats(p: P, ctx: object) -> ToolResult:
        return ToolResult(content="")

    assert stats.works_for(find_task("sglang-cpu-tiny"))
    assert not stats.works_for(find_task("decode-split-norm"))
    with pytest.raises(ValueError, match="needs 'gpu' is not one of"):
        tool("bad", "x", P, needs="gpu")(lambda p, ctx: ToolResult(content=""))


def test_tools_list_prints_the_schemas_a_run_on_the_task_sends() -> None:
    kernel = run_cli("tools", "list", "--task", "decode-split-norm", "--json")
    assert kernel.returncode == 0, kernel.stderr
    schemas = json.loads(kernel.stdout)
    expected = default_registry("dense", find_task("decode-split-norm")).schemas()
    assert schemas == expected  # exactly what the model sees
    names = {s["function"]["name"] for s in schemas}
    assert {"edit_file", "gil_trace"} <= names and not SERVING_TOOLS & names
    serving = run_cli("tools", "list", "--task", "sglang-cpu-tiny", "--json")
    assert serving.returncode == 0, serving.stderr
    assert SERVING_TOOLS <= {s["function"]["name"] for s in json.loads(serving.stdout)}
    table = run_cli("tools", "list", "--task", "kv-transfer-gil")
    assert table.returncode == 0 and "edit_file" in table.stdout
    assert "propose_knobs" not in table.stdout and "serving_workload" not in table.stdout
    unknown = run_cli("tools", "list", "--task", "no-such-task")
    assert unknown.returncode != 0 and "no-such-task" in unknown.stderr
