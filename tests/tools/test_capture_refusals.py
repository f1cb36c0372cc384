"""capture and the replays refuse bad input in one line, before any server starts or any look
is spent: a malformed name, a function SGLang does not define, an unknown capture id, code given
with a capture, and a task with no server (the live flow is test_capture_live.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra_agent.serving.env import find_sglang_env
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

pytestmark = pytest.mark.skipif(
    find_sglang_env() is None,
    reason="SGLang environment not created (python -m infra_agent.serving.env --ensure)",
)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    task = find_task("sglang-cpu-tiny")
    return ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="r", looks_limit=4)


def _error(ctx: ToolContext, tool: str, **arguments: object) -> str:
    result = default_registry("dense", ctx.task).call(tool, json.dumps(arguments), ctx)
    assert result.error is not None and result.data is None, result.content
    assert "\n" not in result.error
    return result.error


def test_capture_refuses_names_sglang_does_not_define_without_spending_a_look(
    ctx: ToolContext,
) -> None:
    bad = _error(ctx, "capture", function="sglang.srt.layers.layernorm.RMSNorm.forward")
    assert "must read 'sglang.module.path:function'" in bad
    missing = _error(ctx, "capture", function="sglang.srt.layers.layernorm:NoSuchNorm.forward")
    assert "sglang.srt.layers.layernorm defines no class NoSuchNorm; its classes: " in missing
    assert "RMSNorm" in missing
    module = _error(ctx, "capture", function="sglang.srt.no_such_module:f")
    assert "no module sglang.srt.no_such_module in SGLang" in module
    assert ctx.looks_used == 0


def test_replays_refuse_an_unknown_capture_and_code_beside_one(ctx: ToolContext) -> None:
    unknown = _error(ctx, "accuracy_diff", captured="c9")
    assert "no capture 'c9' in this run (captures: none yet); run capture(function=...)" in unknown
    assert "no capture 'c9'" in _error(ctx, "microbench", captured="c9")
    both = _error(ctx, "microbench", captured="c1", baseline="f(x)")
    assert "give no setup or expressions" in both


def test_capture_is_offered_only_where_a_server_runs() -> None:
    assert default_registry("dense", find_task("decode-split-norm")).get("capture") is None
    assert default_registry("sparse", find_task("sglang-cpu-tiny")).get("capture") is None
    assert default_registry("dense", find_task("sglang-cpu-tiny")).get("capture") is not None
