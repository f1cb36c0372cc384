"""Capture: an engine function's real arguments, recorded while the task's workload runs.

    target = Target.parse("sglang.srt.layers.layernorm:RMSNorm.forward")
    instrument_workspace(box.root, target, out_dir, limits)  # before the server starts
    ... start the server (its overlay carries the hook), create out_dir/armed, run the workload ...
    record = read_capture(out_dir, target, limits, workload="128 requests ...")
    record.render()   # "RMSNorm.forward: 12 of 4,096 calls kept (x: bfloat16[32,64] ...)"

The hook (`serving/instruments/capture_hook.py`) is copied into the arm's workspace copy as a new SGLang
module, and the target's module (the workspace's, patched or injected, else the installed one)
gets two lines at its end that wrap the function: the server's overlay serves both, so the
capture rides on the same path as any source patch (`serving.overlay`). The harness reads only
the JSON descriptions; the pickled arguments are loaded only by the replay, in a sandbox.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.serving.overlay import installed_package

HOOK_MODULE = "sglang/_infra_agent_capture.py"
"""Where the hook lies in the workspace copy (and so in the server's and the replay's overlay)."""
HOOK_SOURCE = Path(__file__).with_name("capture_hook.py")
_NAME = re.compile(r"^sglang(\.[A-Za-z_]\w*)+:[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")


class CaptureLimits(BaseModel):
    """How much of a function's calls a capture keeps."""

    calls: int = Field(12, ge=2, le=64)
    """Calls kept: the first half, the rest spread over the workload."""
    max_tensor_bytes: int = 16 * 2**20
    """A tensor larger than this is kept as its shape and dtype only."""
    max_call_bytes: int = 64 * 2**20
    """Tensor bytes kept per call; tensors past it are kept as shape and dtype only."""


class Target(BaseModel):
    """A named engine function: `module:qualname`, qualname 'f' or 'Class.method'."""

    module: str
    qualname: str

    @classmethod
    def parse(cls, name: str) -> Target:
        if not _NAME.match(name):
            raise UserError(
                f"function {name!r} must read 'sglang.module.path:function' or "
                "'sglang.module.path:Class.method' (e.g. sglang.srt.layers.layernorm:RMSNorm.forward)"
            )
        module, qualname = name.split(":")
        return cls(module=module, qualname=qualname)

    @property
    def name(self) -> str:
        return f"{self.module}:{self.qualname}"

    def relpaths(self) -> list[str]:
        """The module's file, as a package's `__init__.py` or a plain module."""
        base = self.module.replace(".", "/")
        return [f"{base}.py", f"{base}/__init__.py"]


def module_source(workspace: Path, target: Target, version: str) -> tuple[str, str]:
    """(relative path, source) of the target's module as the arm would serve it: the workspace's
    copy (the task's injected modules, the patch's) first, else the installed package's."""
    installed = installed_package(version).parent
    for rel in target.relpaths():
        for root in (workspace, installed):
            if (root / rel).is_file():
                return rel, (root / rel).read_text()
    raise UserError(f"no module {target.module} in SGLang (looked for {target.relpaths()[0]})")


def check_defined(source: str, target: Target) -> None:
    """Refuse a function the module does not define: a one-line error naming what it does."""
    tree = ast.parse(source)
    owner, _, name = target.qualname.rpartition(".")
    top = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}  # fmt: skip
    if not owner:
        if isinstance(top.get(name), (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        names = sorted(k for k, v in top.items() if not isinstance(v, ast.ClassDef))
        raise UserError(f"{target.module} defines no function {name}; its functions: {_few(names)}")
    node = top.get(owner)
    if not isinstance(node, ast.ClassDef):
        classes = sorted(k for k, v in top.items() if isinstance(v, ast.ClassDef))
        raise UserError(f"{target.module} defines no class {owner}; its classes: {_few(classes)}")
    methods = [n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if name not in methods and not node.bases:
        raise UserError(
            f"{target.module}:{owner} has no method {name}; its methods: {_few(methods)}"
        )


def _few(names: list[str], limit: int = 12) -> str:
    shown = ", ".join(names[:limit]) or "none"
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def instrument_workspace(
    workspace: Path, target: Target, out: Path, limits: CaptureLimits, version: str
) -> None:
    """Put the hook and the wrapped target module into the arm's workspace copy (the overlay
    then serves them); `out` is where the server writes its calls."""
    rel, source = module_source(workspace, target, version)
    check_defined(source, target)
    (workspace / HOOK_MODULE).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(HOOK_SOURCE, workspace / HOOK_MODULE)
    call = ", ".join(
        json.dumps(v)
        for v in (target.qualname, str(out), limits.calls, limits.max_tensor_bytes, limits.max_call_bytes)
    )  # fmt: skip
    hook = (
        "\n\n# infra-agent capture: wraps the function while the workload runs\n"
        "from sglang._infra_agent_capture import install as _infra_agent_capture\n"
        f"_infra_agent_capture(globals(), {call})\n"
    )
    (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
    (workspace / rel).write_text(source + hook)


class CapturedCall(BaseModel):
    """One kept call, as the server described it (the arguments themselves are in `file`)."""

    index: int
    """The call's number in its process (0: the first after the capture was armed)."""
    pid: int
    args: list[Any]
    """Each positional argument described: {'tensor': shape, 'dtype': ...}, a scalar, or
    {'object': type} (for a method the first is the object, e.g. the RMSNorm module)."""
    kwargs: dict[str, Any]
    result: Any
    live_ns: int
    """How long the call took in the live server, ns."""
    stored_only: int = 0
    """Tensors kept as shape and dtype only (over the size limits)."""
    file: str
    """The pickled arguments' file name in the capture's folder."""


class CaptureRecord(BaseModel):
    """The `capture` tool's record: which function, what its calls looked like, where they lie."""

    version: int = 1
    capture_id: str
    function: str
    label: str
    """The server captured on: 'baseline' or the patch and what it changes."""
    workload: str
    calls_seen: int
    """Calls counted while the workload ran (all processes)."""
    calls: list[CapturedCall] = Field(default_factory=list)
    folder: str
    errors: list[str] = Field(default_factory=list)
    """What the hook could not record (unpicklable arguments ...)."""

    def render(self) -> str:
        short = self.function.split(":")[1]
        head = (
            f"capture {self.capture_id}: {short}, {len(self.calls)} of {self.calls_seen:,} calls "
            f"kept ({self.label}; {self.workload})"
        )
        lines = [head]
        shapes: dict[str, int] = {}
        for c in self.calls:
            shapes[signature(c)] = shapes.get(signature(c), 0) + 1
        for sig, n in sorted(shapes.items(), key=lambda kv: -kv[1])[:4]:
            lines.append(f"  {n}x ({sig})")
        live = sorted(c.live_ns for c in self.calls)
        if live:
            lines.append(f"  live call time: median {live[len(live) // 2] / 1e3:.1f} us")
        stored = sum(c.stored_only for c in self.calls)
        if stored:
            lines.append(f"  {stored} tensors over the size limit kept as shape and dtype only")
        lines += [f"  error: {e}" for e in self.errors[:3]]
        lines.append(
            f"replay: microbench or accuracy_diff with captured='{self.capture_id}' (and "
            "patch_id for the candidate)"
        )
        return "\n".join(lines)


def signature(call: CapturedCall) -> str:
    """'x: bfloat16[32,64], residual: None' from a call's descriptions (positional by number)."""
    parts = [f"arg{i}: {_short(a)}" for i, a in enumerate(call.args)]
    parts += [f"{k}: {_short(v)}" for k, v in call.kwargs.items()]
    return ", ".join(parts)


def _short(value: Any) -> str:
    if isinstance(value, dict) and "tensor" in value:
        return f"{value['dtype']}[{','.join(map(str, value['tensor']))}]"
    if isinstance(value, dict) and "object" in value:
        return str(value["object"]).rsplit(".", 1)[-1]
    if isinstance(value, list):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    return json.dumps(value)[:40]


def read_capture(out: Path) -> tuple[int, list[CapturedCall], list[str]]:
    """(calls counted, the kept calls in order, error lines) from the folder a server wrote."""
    seen = 0
    for counter in out.glob("count-*"):
        data = counter.read_bytes()[:8]
        if len(data) == 8:
            seen += struct.unpack("<q", data)[0]
    calls = []
    for meta in sorted(out.glob("call-*.json")):
        pt = meta.with_suffix(".pt")
        if not pt.is_file():
            continue
        fields = json.loads(meta.read_text())
        calls.append(CapturedCall(**fields, file=pt.name))
    errors = [ln for e in sorted(out.glob("error-*")) for ln in e.read_text().splitlines()]
    calls.sort(key=lambda c: (c.pid, c.index))
    return seen, calls, sorted(set(errors))
