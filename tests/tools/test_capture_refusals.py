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


def test_a_replay_sandbox_limits_resident_memory_not_its_address_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relay run's replay failed to allocate 4 MB under the 4 GiB address-space limit (SGLang's
    interpreter reserves far more than it uses): a replay's sandbox limits resident memory only;
    a plain sandbox keeps the address-space limit. Both run one compute thread, as the CPU
    servers do (OMP_NUM_THREADS=1)."""
    from infra_agent.tools import replay, sandboxed

    ctx = ToolContext(task=find_task("sglang-cpu-tiny"), store=open_store(tmp_path / "r.db"), run_id="r")  # fmt: skip
    opened: list[bool] = []

    def fake_open(ctx, patch, readonly=None, *, resident_only=False):  # type: ignore[no-untyped-def]
        opened.append(resident_only)
        raise RuntimeError("stop here")  # the spec asked for is what this test reads

    if find_sglang_env() is None:
        pytest.skip("SGLang environment not created (python -m infra_agent.serving.env --ensure)")
    monkeypatch.setattr(replay, "open_sandbox", fake_open)
    with pytest.raises(RuntimeError, match="stop here"):
        replay.sglang_arm(ctx, None, "0.5.23")
    assert opened == [True]
    box = sandboxed.open_sandbox(ctx, None)
    try:
        assert box.spec.limit_address_space and box.spec.env["OMP_NUM_THREADS"] == "1"
    finally:
        box.cleanup()
