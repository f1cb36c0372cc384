"""`gil_trace`: the GIL tracer attached to the task's code while it runs in a sandboxed workspace.

As for `profile`, the model gives setup code and an expression; a private, network-less copy of
the workspace (optionally patched) runs the setup, then calls the expression in a loop, in the
sandbox the experiments use, while the two py-spy recorders of `feedback.gil.record` sample it
for `seconds` (native stacks; the interpreter's GIL owner). The answer, from the same analysis
as `infra-agent feedback gil`: per named thread, its shares of holding / waiting for the GIL /
running without it / idle, where the waiting threads wait, and who held the GIL meanwhile,
decisive line first; the typed `GilReport` is the data. Needs py-spy next to the sandbox's
Python (the local backend's venv) and ptrace within the sandbox.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import time
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.feedback.gil import GilReport
from infra_agent.sandboxes import Sandbox, SandboxProcess
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext
from infra_agent.tools.sandboxed import compile_check, open_sandbox

SCRIPT = "_infra_agent_gil.py"
STACKS, HOLDERS, DONE = (
    ".infra_agent_gil.stacks",
    ".infra_agent_gil.holders",
    ".infra_agent_gil.done",
)
STARTUP_TIMEOUT_S = 120.0
"""How long the setup and the first call may take before tracing starts."""
RATE = 20
"""Samples per second."""

# py-spy runs inside the sandbox, a child of the traced process: from outside, in another pid
# namespace, it cannot unwind native stacks, and without them a GIL wait cannot be told apart.
_LOOP = """\
import json, os, subprocess, sys, time
sys.path.insert(0, ".")
sys.stdout = open(os.devnull, "w")  # nobody reads the pipe: prints must not fill it
ns = {}
exec(compile(SETUP, "<setup>", "exec"), ns)
f = eval(compile("lambda: (" + CODE + ")", "<code>", "eval"), ns)
f()  # imports and first-call costs before the tracer looks
recorders = []
for cmd in RECORDERS:
    cmd[cmd.index("--pid") + 1] = str(os.getpid())
    err = open(cmd[-1] + ".err", "w")
    recorders.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err))
start = time.monotonic()
while any(r.poll() is None for r in recorders) and time.monotonic() - start < LIMIT_S:
    f()
window = time.monotonic() - start
for r in recorders:
    if r.poll() is None:
        r.kill()
open(DONE, "w").write(json.dumps({"window_s": window}))
"""


class GilTrace(BaseModel):
    setup: str = Field(
        description="Python run once first (imports from workspace modules, inputs)."
    )
    code: str = Field(
        description="Expression called again and again while the tracer samples, e.g. "
        "'run_steps(kv, moe_layers=1)'; the threads it starts are traced too."
    )
    patch_id: str | None = Field(None, description="Apply this patch to the workspace copy first.")
    seconds: float = Field(3.0, ge=1.0, le=15.0, description="How long to sample.")


class GilTraceRecord(GilReport):
    """`feedback gil`'s GilReport, plus the expression that was called in a loop."""

    code: str

    def render(self) -> str:
        head = f"GIL trace of `{self.code[:80]}` called in a loop, inside the sandbox"
        return f"{super().render()}\n{head}"


@instrument(
    "gil_trace",
    "Attach the GIL tracer (py-spy) to the task's code running in a sandboxed copy of the "
    "workspace: per named thread, its shares of holding / waiting for / running without the "
    "GIL and idle, where waiting threads wait, and which thread and stack held the GIL meanwhile.",
    GilTrace,
    needs="python",
)
def gil_trace(p: GilTrace, ctx: ToolContext) -> ToolResult:
    from infra_agent.feedback.gil.record import read_recording, recorder_commands
    from infra_agent.feedback.gil.trace import report_of_recording

    compile_check(p.setup, "exec", "setup")
    compile_check(p.code, "eval", "code")
    recorders = recorder_commands(0, rate=RATE, duration_s=p.seconds, stacks_out=Path(STACKS),
                                  gil_out=Path(HOLDERS))  # fmt: skip
    values = {"SETUP": textwrap.dedent(p.setup), "CODE": p.code, "RECORDERS": recorders,
              "DONE": DONE, "LIMIT_S": p.seconds + 60}  # fmt: skip
    script = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()) + _LOOP
    with open_sandbox(ctx, ctx.patch(p.patch_id) if p.patch_id else None) as box:
        box.write_file(SCRIPT, script.encode())
        process = box.spawn([sys.executable, SCRIPT])
        try:
            _wait_until_done(box, process, STARTUP_TIMEOUT_S + 2 * p.seconds + 60)
        finally:
            box.kill(process)
        # Each recorder samples for its --duration once attached; the loop also ran meanwhile.
        looped_s = float(json.loads(box.read_file(DONE))["window_s"])
        window_s = min(looped_s, math.ceil(p.seconds))
        rec = read_recording(
            box.root / STACKS, box.root / HOLDERS, pid=process.pid, rate=RATE,
            window_s=window_s, elapsed_s=window_s,
            stacks_error=_error_line(box, STACKS), gil_error=_error_line(box, HOLDERS),
        )  # fmt: skip
    report = report_of_recording(rec, process.pid, RATE, blame_threshold=0.2)
    return ToolResult.of(GilTraceRecord(**dict(report), code=p.code))


def _wait_until_done(box: Sandbox, process: SandboxProcess, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (box.root / DONE).exists():
        _check_alive(box, process)
        if time.monotonic() > deadline:
            raise UserError(f"the traced code did not finish tracing within {timeout_s:.0f} s")
        time.sleep(0.05)


def _error_line(box: Sandbox, output: str) -> str:
    path = box.root / (output + ".err")
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return next((ln.strip() for ln in lines if ln.startswith("Error")), "")


def _check_alive(box: Sandbox, process: SandboxProcess) -> None:
    code = process.handle.poll()  # type: ignore[attr-defined]
    if code is None:
        return
    tail = ""
    if process.stderr_path is not None and process.stderr_path.exists():
        lines = process.stderr_path.read_text(errors="replace").strip().splitlines()
        tail = "\n".join(lines[-6:])
    raise UserError(f"the traced code exited (exit {code}):\n{tail}".rstrip())
