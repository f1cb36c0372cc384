"""Looks on a patched real SGLang server (sglang-slow-decode, CPU, tiny model): a source patch
(the task's reference fix, plus a function that spins 20 ms in every decode attention call, which
only the patched code has) is profiled before any experiment; the profile names that function,
so the look ran the patched code. A second look at the same patch reuses the kept server, each
answer says it is not a verdict, the looks budget refuses a third look in one line, and closing
the context (the run's end) stops the server.

Needs the SGLang environment (`python -m infra_agent.serving.env --ensure`). One server start
(30-90 s on a loaded 2-core machine) and two small workloads (the profile's 32 requests sent
again, a few times over, for 300 samples): about 1.5-2.5 minutes, above the 60 s a default-tier
test should take, because a patched server must really start once for a look to be shown to run
the patch (the stand-in test in test_workload_tools.py covers the workload a look sends).
"""

from __future__ import annotations

import json
from pathlib import Path

from support import sglang_server_marks

from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

pytestmark = sglang_server_marks(timeout_s=1200)

BACKEND = "sglang/srt/layers/attention/torch_native_backend.py"
MARKER = """from sglang.srt.layers.radix_attention import AttentionType
import time as _time


def _infra_agent_look_marker():
    end = _time.perf_counter() + 0.02
    while _time.perf_counter() < end:
        pass
"""


def test_a_look_profiles_a_source_patch_reuses_its_server_and_keeps_to_its_budget(
    tmp_path: Path,
) -> None:
    task = find_task("sglang-slow-decode")
    ctx = ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="r")
    ctx.looks_limit = 2
    reg = default_registry("dense", task)
    fix = (task.root / "reference.patch").read_text()
    proposed = reg.call("propose_patch", json.dumps({"diff": fix, "rationale": "fix"}), ctx)
    assert proposed.data is not None, proposed.error
    edits = [
        ("from sglang.srt.layers.radix_attention import AttentionType\n", MARKER),
        (
            '        """Run the decode forward by using torch native sdpa op.',
            "        _infra_agent_look_marker()\n"
            '        """Run the decode forward by using torch native sdpa op.',
        ),
    ]
    base = proposed.data["patch_id"]
    for old, new in edits:
        edited = reg.call(
            "edit_file", json.dumps({"path": BACKEND, "old": old, "new": new, "base": base}), ctx
        )
        assert edited.data is not None, edited.error
        base = edited.data["patch_id"]
    try:
        args = {"patch_id": base, "processes": ["scheduler"], "gil_seconds": 0, "num_prompts": 32}
        profile = reg.call("server_profile", json.dumps(args), ctx)
        print(profile.content)
        assert profile.error is None and profile.data is not None, profile.content
        (scheduler,) = profile.data["processes"]
        hot = {
            f"{r['file']}:{r['function']}" for r in scheduler["top_self"] + scheduler["top_total"]
        }
        assert f"{BACKEND}:_infra_agent_look_marker" in hot, hot  # the patched code ran
        # Enough samples to decide (the workload is sent again when short), the sampling error
        # stated, names whole with their hottest lines (the marker's are its own, 11-17).
        assert scheduler["samples"] >= 300 and scheduler["share_error"] < 0.06
        assert "over (fresh prompts, <= 32 in flight) for 300+ samples" in profile.content
        assert "shares +-" in profile.content and " points (95%)" in profile.content
        (marker,) = [
            r for r in scheduler["top_self"] if r["function"] == "_infra_agent_look_marker"
        ]
        assert marker["hot_lines"] and all(11 <= n <= 17 for n, _ in marker["hot_lines"])
        assert f"{BACKEND}:_infra_agent_look_marker (lines " in profile.content
        look = profile.data["look"]
        assert (look["patch_id"], look["number"], look["limit"]) == (base, 1, 2)
        assert look["reused"] is False and look["start_s"] > 0
        last = profile.content.splitlines()[-1]
        assert last.startswith(f"look 1/2 at patch {base[:12]} (diff: {BACKEND})"), last
        assert "not a verdict" in last and "server started" in last
        (kept,) = ctx.look_servers.servers.values()
        server = kept.arm.state["server"]
        assert server.paused  # between looks the server takes no CPU

        steps = reg.call("server_steps", json.dumps({"patch_id": base, "num_prompts": 8}), ctx)
        print(steps.content)
        assert steps.error is None and steps.data is not None, steps.content
        assert steps.data["look"]["reused"] is True and steps.data["decode_steps"] > 0
        assert "look 2/2 " in steps.content and "server reused" in steps.content
        assert "not a verdict" in steps.content
        assert list(ctx.look_servers.servers.values()) == [kept]  # no second start

        spent = reg.call("serving_workload", json.dumps({"patch_id": base}), ctx)
        assert spent.error is not None and "\n" not in spent.error
        assert spent.error.startswith("serving_workload: looks budget spent (2/2)")
    finally:
        ctx.close()
    assert not server.alive() and not ctx.look_servers.servers
    assert not kept.arm.sandbox.root.exists()  # its workspace copy is gone too
