"""Replaying captured calls (`tools.capture`) in a sandbox that imports the real SGLang package.

Each arm is a sandboxed workspace copy (the baseline: the task's workspace, its injected fault
included; the candidate: with the patch) that also sees the SGLang environment read-only. Its
SGLang modules are served the way the server's are (`serving.overlay.build_overlay`: the copy's
changed modules over links into the installed package, plus the capture hook's module, whose
`Stored` placeholders the pickled calls refer to), the CPU kernel shim beside them when there is
no GPU, and the script runs under SGLang's interpreter. It loads every captured call (a tensor
kept as shape and dtype only gets seeded random values, the same in both arms) and calls the
arm's own function with it: `REPLAY_SETUP` defines `replay_all()` for `microbench`'s worker and
`REPLAY_OUTPUTS` writes each call's outputs (and its tensor arguments after the call, so an
in-place change is compared too) for `accuracy_diff`.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from infra_agent.errors import UserError
from infra_agent.tools.capture import load_capture
from infra_agent.tools.context import ToolContext
from infra_agent.tools.sandboxed import ArmParams, Arms, open_sandbox, resolve_arms

if TYPE_CHECKING:
    from infra_agent.sandboxes.base import Sandbox
    from infra_agent.serving.instruments.capture import CaptureRecord
    from infra_agent.tasks.patch import Patch

REPLAY_DIR = ".replay"

SGLANG_PRELUDE = """\
import os, sys
sys.path[:0] = PATHS
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
"""
"""First in every script of a serving task's arm: its SGLang modules (overlay, shim) importable."""

REPLAY_SETUP = """\
import importlib, torch
from sglang._infra_agent_capture import Stored
_module = importlib.import_module(MODULE)
_owner, _, _name = QUALNAME.rpartition(".")
replayed = getattr(getattr(_module, _owner), _name) if _owner else getattr(_module, _name)
_gen = torch.Generator().manual_seed(0)
def _fill(v):
    if isinstance(v, Stored):
        dtype = getattr(torch, v.dtype)
        if dtype.is_floating_point:
            return torch.randn(v.shape, generator=_gen).to(dtype)
        return torch.randint(0, 16, v.shape, generator=_gen).to(dtype)
    if isinstance(v, (list, tuple)):
        return type(v)(_fill(x) for x in v)
    if isinstance(v, dict):
        return {k: _fill(x) for k, x in v.items()}
    return v
CALLS = []
for _file in FILES:
    _call = torch.load(os.path.join(CALLS_DIR, _file), weights_only=False)
    CALLS.append((_fill(list(_call["args"])), _fill(dict(_call["kwargs"]))))
def replay_all():
    out = None
    with torch.inference_mode():
        for args, kwargs in CALLS:
            out = replayed(*args, **kwargs)
    return out
"""
"""The arm's function and the captured calls, loaded; `replay_all()` runs each call once."""

REPLAY_OUTPUTS = """\
def _tensors(value, name, out):
    if isinstance(value, torch.Tensor):
        out[name] = value.detach().cpu().clone()
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _tensors(v, f"{name}.{i}", out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _tensors(v, f"{name}.{k}", out)
result = {}
with torch.inference_mode():
    for n, (args, kwargs) in enumerate(CALLS):
        _tensors(replayed(*args, **kwargs), f"call{n}.out", result)
        for i, a in enumerate(args):
            _tensors(a, f"call{n}.arg{i}", result)
        for k, a in kwargs.items():
            _tensors(a, f"call{n}.{k}", result)
torch.save(result, RESULT)
"""


def serving_version(ctx: ToolContext) -> str | None:
    """The task's SGLang version (None: not a serving task)."""
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.tools.base import NEEDS
    from infra_agent.tools.workload import harness_of

    if not NEEDS["serving"](ctx.task.manifest):
        return None
    harness = harness_of(ctx.task, ctx.params)
    return harness.deployment.sglang_version if isinstance(harness, ServingHarness) else None


def sglang_arm(
    ctx: ToolContext,
    patch: Patch | None,
    version: str,
    capture: tuple[CaptureRecord, Path] | None = None,
) -> tuple[Sandbox, str, str]:
    """(a sandboxed workspace copy with `patch` that imports the real SGLang package, SGLang's
    interpreter, the code its scripts run first: the modules on the path and, with a capture,
    `replayed`, `CALLS` and `replay_all()`)."""
    from infra_agent.serving.env import ensure_sglang_env, env_python
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.serving.instruments.capture import HOOK_MODULE, HOOK_SOURCE, Target
    from infra_agent.serving.launch import SHIM_DIR, has_gpu
    from infra_agent.serving.overlay import build_overlay

    env = ensure_sglang_env(version)
    # SGLang's interpreter (torch, the package, a replay's captured KV pools) reserves far more
    # address space than it uses: a relay run's replay failed to allocate 4 MB under the 4 GiB
    # address-space limit. The limit holds on resident memory (the sandbox's cgroup).
    box = open_sandbox(ctx, patch, readonly=[env], resident_only=True)
    try:
        root = Path(box.root)
        if capture is not None:
            (root / HOOK_MODULE).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HOOK_SOURCE, root / HOOK_MODULE)
        files = ServingHarness.overlay_files(root)
        overlay = build_overlay(root, files, root / REPLAY_DIR / "overlay", version)
        values: dict[str, object] = {"PATHS": [str(overlay)] if overlay else []}
        if not has_gpu():
            shutil.copytree(SHIM_DIR, root / REPLAY_DIR / "shim")
            values["PATHS"] = [*values["PATHS"], str(root / REPLAY_DIR / "shim")]  # type: ignore[misc]
        code = SGLANG_PRELUDE
        if capture is not None:
            record, folder = capture
            calls = root / REPLAY_DIR / "calls"
            calls.mkdir(parents=True)
            for call in record.calls:
                shutil.copyfile(folder / call.file, calls / call.file)
            target = Target.parse(record.function)
            values |= {
                "MODULE": target.module, "QUALNAME": target.qualname,
                "FILES": [c.file for c in record.calls], "CALLS_DIR": str(calls),
            }  # fmt: skip
            code += REPLAY_SETUP
    except BaseException:
        box.cleanup()
        raise
    bound = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    return box, str(env_python(env)), bound + code


def replay_arms(
    p: ArmParams, ctx: ToolContext, version: str | None
) -> tuple[Arms, Patch | None, tuple[CaptureRecord, Path] | None]:
    """(what each arm runs, the candidate's patch, the capture replayed or None): the model's
    code or the experiment's workload (`resolve_arms`), or with `captured` every captured call
    once per iteration (`replay_all()`)."""
    from infra_agent.tools.capture import describe_calls

    captured = getattr(p, "captured", None)
    if not captured:
        arms, patch = resolve_arms(ctx, p.setup, p.baseline, p.candidate, p.patch_id)
        return arms, patch, None
    if p.setup or p.baseline or p.candidate:
        raise UserError("captured replays the capture's own calls: give no setup or expressions")
    if version is None:
        raise UserError(f"task {ctx.task.name} is not a serving task: nothing was captured")
    patch = ctx.patch(p.patch_id) if p.patch_id else None
    record, folder = load_capture(ctx, captured)
    arms = Arms(
        setup="", baseline="replay_all()", candidate="replay_all()", patch_id=p.patch_id,
        captured=describe_calls(record),
    )  # fmt: skip
    return arms, patch, (record, folder)


def arm_box(
    ctx: ToolContext,
    patch: Patch | None,
    version: str | None,
    capture: tuple[CaptureRecord, Path] | None,
) -> tuple[Sandbox, str, str]:
    """(an arm's sandbox, its interpreter, the code its scripts run first): on a serving task
    one that imports the real SGLang package (`tools.replay.sglang_arm`)."""
    if version is None:
        return open_sandbox(ctx, patch), sys.executable, ""
    return sglang_arm(ctx, patch, version, capture)
