"""Capture and replay of a real SGLang function (sglang-cpu-tiny, CPU, tiny model), driven by
the scripted policy (test equipment: recorded replies) through the real graph: `capture` records `RMSNorm.forward`'s calls on the live server
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
from typing import Any

import pytest

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.runner import start_run
from infra_agent.agent.state import Budget
from infra_agent.config import load_settings
from infra_agent.serving.env import find_sglang_env
from infra_agent.store import open_store

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


NEVER = "sglang.srt.layers.layernorm:GemmaRMSNorm.forward_native"


def _call(name: str, **arguments: object) -> dict[str, object]:
    return {"content": "", "tool_calls": [{"name": name, "arguments": arguments}]}


def conversation() -> list[dict[str, object]]:
    """What a model checking an RMSNorm change on its real arguments would send, reply by reply
    (capture ids are c1, c2, ... in a run; patch ids come from `{{last_patch_id}}`)."""
    precise = {"path": LAYERNORM, "old": FLOAT32, "new": FLOAT32.replace("float32", "float64")}
    return [
        _call("capture", function=NORM, num_prompts=8, calls=6),
        _call("accuracy_diff", captured="c1"),
        _call("edit_file", **precise),
        _call("accuracy_diff", captured="c1", patch_id="{{last_patch_id}}"),
        _call("microbench", captured="c1", patch_id="{{last_patch_id}}", seconds=1),
        _call("edit_file", path=LAYERNORM, old=SCALED[0], new=SCALED[1]),
        _call("accuracy_diff", captured="c1", patch_id="{{last_patch_id}}"),
        _call("capture", function=NEVER, num_prompts=8),
        _call("finish", summary="replayed"),
    ]


def test_capture_a_real_function_and_replay_it_against_baseline_and_patches(
    tmp_path: Path,
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(conversation()))
    db = tmp_path / "runs.db"
    settings = load_settings(overrides={"store.db": str(db)})
    config = RunConfig(
        task="sglang-cpu-tiny", policy="scripted", script=str(script),
        budget=Budget(experiments=1, turns=12, looks=4),
    )  # fmt: skip
    outcome = start_run(config, settings)
    store = open_store(db)
    steps = [s for s in store.steps(outcome.run_id) if s.role == "tool"]
    for step in steps:
        print(f"--- {step.name}\n{step.content or step.error}")
    by_name: dict[str, list[Any]] = {}
    for step in steps:
        by_name.setdefault(str(step.name), []).append(step)

    cap, refused = by_name["capture"]
    assert cap.error is None, cap.content
    assert cap.content.startswith("capture c1: RMSNorm.forward, 6 of ")
    assert "arg0: RMSNorm, arg1: bfloat16[" in cap.content and "replay:" in cap.content
    assert "error:" not in cap.content  # every kept call was recorded

    same, wide, off = by_name["accuracy_diff"]
    for step in (same, wide, off):
        assert step.error is None, step.content
        assert step.content.startswith("accuracy_diff RMSNorm.forward, 6 calls captured (")
    assert "max abs err 0 over 6 calls" in same.content  # baseline against itself: exact
    assert "would pass the experiment's accuracy rule" in wide.content  # float64: rounding only
    assert "would fail the experiment's accuracy rule" in off.content  # x1.5: refused
    assert "max abs err 0 over" not in off.content

    [timed] = by_name["microbench"]
    assert timed.error is None, timed.content
    assert timed.content.startswith("microbench RMSNorm.forward, 6 calls captured (")
    assert "interleaved samples" in timed.content

    assert refused.error is not None
    assert f"{NEVER} was not called during the workload (8 requests)" in refused.error
    assert "functions with the most self time in the scheduler: " in refused.error
    store.close()
