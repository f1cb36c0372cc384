"""Capture and replay of a real SGLang function (sglang-cpu-tiny, CPU, tiny model), through the
tool registry as a model calls it: `capture` records `RMSNorm.forward`'s calls on the live server
while the task's workload runs; `accuracy_diff` and `microbench` replay those calls, with their
real arguments (the RMSNorm modules with their weights, bfloat16 activations of the workload's
shapes), in sandboxes that import the real SGLang package: baseline against itself (exactly
equal), against a patch that computes the norm in float64 (within bfloat16's tolerance), and
against a patch that scales its output (a difference the rule refuses). A function that is never
called is refused in one line that names where the time went.

Needs the SGLang environment (`python -m infra_agent.serving.env --ensure`). Two server starts
(30-90 s each on a loaded 2-core machine) and replays whose sandboxes import SGLang (a minute each
when the machine is busy; both arms at once): about 5-8 minutes, far above the 60 s a default
test should take, because only a real server shows that the hook rides the overlay and that the
replay imports the real package: so it is in the long tier.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra_agent.serving.env import find_sglang_env
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

pytestmark = [
    pytest.mark.timeout(2400),
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.sglang,
    pytest.mark.skipif(
        find_sglang_env() is None,
        reason="SGLang environment not created (python -m infra_agent.serving.env --ensure)",
    ),
]

NORM = "sglang.srt.layers.layernorm:RMSNorm.forward"
LAYERNORM = "sglang/srt/layers/layernorm.py"
FLOAT32 = (
    "        orig_dtype = self.override_orig_dtype or x.dtype\n"
    "        x = x.to(torch.float32)\n"
    "        if residual is not None:\n"
    "            x = x + residual.to(torch.float32)\n"
)
SCALED = (
    "            x = (x * self.weight).to(orig_dtype)\n",
    "            x = (x * self.weight * 1.5).to(orig_dtype)\n",
)


def test_capture_a_real_function_and_replay_it_against_baseline_and_patches(
    tmp_path: Path,
) -> None:
    task = find_task("sglang-cpu-tiny")
    ctx = ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="r")
    reg = default_registry("dense", task)
    try:
        args = {"function": NORM, "num_prompts": 8, "calls": 6}
        cap = reg.call("capture", json.dumps(args), ctx)
        print(cap.content)
        assert cap.error is None and cap.data is not None, cap.content
        data = cap.data
        assert data["calls_seen"] >= len(data["calls"]) > 0
        assert len(data["calls"]) <= 6
        first = data["calls"][0]
        assert first["args"][0] == {"object": "sglang.srt.layers.layernorm.RMSNorm"}
        assert first["args"][1]["dtype"] == "bfloat16" and len(first["args"][1]["tensor"]) == 2
        assert "RMSNorm.forward" in cap.content and "replay:" in cap.content
        cid = data["capture_id"]

        same = reg.call("accuracy_diff", json.dumps({"captured": cid}), ctx)
        print(same.content)
        assert same.error is None and same.data is not None, same.content
        assert same.data["probes"] and all(p["diff"]["max_abs"] == 0 for p in same.data["probes"])
        assert same.content.startswith("accuracy_diff RMSNorm.forward, ")
        assert "max abs err 0 over" in same.content

        precise = _edit(reg, ctx, FLOAT32, FLOAT32.replace("float32", "float64"))
        wide = reg.call("accuracy_diff", json.dumps({"captured": cid, "patch_id": precise}), ctx)
        print(wide.content)
        assert wide.error is None and wide.data is not None, wide.content
        assert wide.data["would_pass"] is True

        scaled = _edit(reg, ctx, *SCALED)
        off = reg.call("accuracy_diff", json.dumps({"captured": cid, "patch_id": scaled}), ctx)
        print(off.content)
        assert off.error is None and off.data is not None, off.content
        assert off.data["would_pass"] is False
        assert max(p["diff"]["max_abs"] for p in off.data["probes"]) > 0

        bench = {"captured": cid, "patch_id": precise, "seconds": 1}
        timed = reg.call("microbench", json.dumps(bench), ctx)
        print(timed.content)
        assert timed.error is None and timed.data is not None, timed.content
        assert timed.data["arms"]["captured"].startswith("RMSNorm.forward, ")
        assert timed.data["rounds"] >= 1

        never = {"function": "sglang.srt.layers.layernorm:GemmaRMSNorm.forward_native"}
        refused = reg.call("capture", json.dumps({**never, "num_prompts": 8}), ctx)
        print(refused.content)
        assert refused.error is not None
        assert "was not called during the workload (8 requests)" in refused.content
        assert "functions with the most self time in the scheduler: " in refused.content
    finally:
        ctx.close()


def _edit(reg: object, ctx: ToolContext, old: str, new: str) -> str:
    edited = reg.call(  # type: ignore[attr-defined]
        "edit_file", json.dumps({"path": LAYERNORM, "old": old, "new": new}), ctx
    )
    assert edited.data is not None, edited.error
    return str(edited.data["patch_id"])
