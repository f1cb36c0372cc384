"""Instrument tools: the model's hypotheses tested on the task's code, inside a sandbox.

Each tool runs a small script the model writes (setup code and expressions) against a private,
network-less copy of the workspace (optionally with one of its patches applied), in the same
sandbox the experiments use, with the harness and this package hidden. The raw numbers come back
to this process, where the instruments of `feedback/` turn them into a verdict and a short text:

- `microbench`: two statements timed interleaved in one process; `feedback.bench.compare_samples`
  gives the speedup with a 95% CI.
- `accuracy_diff`: two (or three, with a float64 reference) expressions evaluated to tensors or
  dicts of named tensors; `feedback.accuracy.compare_paths` finds where they part ways.
- `profile`: a `torch.profiler` timeline of a statement, every thread's ops on a track named by
  the thread, summarized by `feedback.timeline`: time by op class, the top ops, launch gaps,
  and overlaps between op groups.
"""

from __future__ import annotations

import io
import json
import textwrap
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import Tool, ToolResult, tool
from infra_agent.tools.context import ToolContext

RESULT_FILE = ".infra_agent_instrument.out"

_PRELUDE = """\
import json, sys, time
sys.path.insert(0, ".")
ns = {}
exec(compile(SETUP, "<setup>", "exec"), ns)
"""

_MICROBENCH = (
    _PRELUDE
    + """\
fa = eval(compile("lambda: (" + BASE + ")", "<baseline>", "eval"), ns)
fb = eval(compile("lambda: (" + CAND + ")", "<candidate>", "eval"), ns)
for f in (fa, fb):
    f()
n, t0 = 1, time.perf_counter()
fa()
one = max(time.perf_counter() - t0, 1e-7)
n = max(1, min(10000, int(MIN_SAMPLE_S / one)))
base, cand, end = [], [], time.perf_counter() + BUDGET_S
i = 0
while (time.perf_counter() < end or len(base) < 5) and len(base) < 60:
    order = ((fa, base), (fb, cand)) if i % 2 == 0 else ((fb, cand), (fa, base))
    for f, out in order:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            f()
        out.append((time.perf_counter_ns() - t0) / 1e9 / n)
    i += 1
open(RESULT, "w").write(json.dumps({"baseline": base, "candidate": cand, "iterations": n}))
"""
)

_ACCURACY = (
    _PRELUDE
    + """\
import torch
def named(value, label):
    if isinstance(value, torch.Tensor):
        return {"output": value.detach().cpu()}
    if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
        return {str(k): v.detach().cpu() for k, v in value.items()}
    raise TypeError(label + " must evaluate to a tensor or a dict of tensors, got " + type(value).__name__)
out = {"baseline": named(eval(BASE, ns), "baseline"), "candidate": named(eval(CAND, ns), "candidate")}
if REF:
    out["reference"] = named(eval(REF, ns), "reference")
torch.save(out, RESULT)
"""
)

_PROFILE = (
    """\
import sys, threading
names = {}
def _name_thread(*args):  # a new thread's first call: note its name, stop being called
    names[threading.get_native_id()] = threading.current_thread().name
    sys.setprofile(None)
threading.setprofile(_name_thread)
"""
    + _PRELUDE
    + """\
import torch
from torch.profiler import ProfilerActivity, profile
try:  # every thread, not only this one (torch >= 2.8)
    from torch._C._profiler import _ExperimentalConfig
    options = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
except (ImportError, TypeError):
    options = {}
names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id})
f = eval(compile("lambda: (" + STMT + ")", "<code>", "eval"), ns)
f()
with profile(activities=[ProfilerActivity.CPU], **options) as prof:
    t0 = time.perf_counter()  # not the profiler's start and stop (seconds with all threads)
    for _ in range(REPEAT):
        f()
    wall = (time.perf_counter() - t0) / REPEAT
prof.export_chrome_trace(RESULT)
open(RESULT + ".wall", "w").write(str(wall))
open(RESULT + ".threads", "w").write(json.dumps({"all": bool(options), "names": names}))
"""
)


def _script(template: str, **values: Any) -> str:
    header = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    return header + f"RESULT = {json.dumps(RESULT_FILE)}\n" + template


def run_in_sandbox(
    ctx: ToolContext,
    script: str,
    patch_id: str | None,
    timeout_s: float,
    extra: list[str] | None = None,
) -> Any:
    """Run `script` in a sandboxed workspace copy (patched if asked); return its result file's
    bytes (a tuple with the `extra` files' bytes when asked). Raises UserError with the script's
    error when it fails."""
    import sys

    from infra_agent.experiments.arms import sandbox_spec
    from infra_agent.sandboxes import create_sandbox
    from infra_agent.tasks.patch import apply_patch
    from infra_agent.tasks.tree import workspace_folder

    patch = ctx.patch(patch_id) if patch_id else None
    with workspace_folder(ctx.task, patch.files if patch else ()) as folder:
        box = create_sandbox(ctx.sandbox, folder, sandbox_spec(ctx.task))
    with box:
        if patch is not None:
            apply_patch(patch, ctx.task, box.root)
        box.write_file("_infra_agent_instrument.py", script.encode())
        result = box.exec([sys.executable, "_infra_agent_instrument.py"], timeout_s=timeout_s)
        if result.timed_out:
            raise UserError(f"the instrument script ran past {timeout_s:.0f} s and was killed")
        if result.returncode != 0:
            tail = "\n".join(result.stderr.strip().splitlines()[-6:])
            raise UserError(f"the instrument script failed (exit {result.returncode}):\n{tail}")
        if extra:
            return (box.read_file(RESULT_FILE), *(box.read_file(name) for name in extra))
        return box.read_file(RESULT_FILE)


def _compile_check(code: str, mode: str, what: str) -> None:
    try:
        compile(code, f"<{what}>", mode)
    except SyntaxError as exc:
        raise UserError(f"{what} is not valid Python ({exc.msg}, line {exc.lineno})") from exc


class Microbench(BaseModel):
    setup: str = Field(
        description="Python run once first (imports from workspace modules, inputs)."
    )
    baseline: str = Field(description="Expression timed as the baseline, e.g. 'f(x)'.")
    candidate: str = Field(description="Expression timed as the candidate, e.g. 'g(x)'.")
    patch_id: str | None = Field(None, description="Apply this patch to the workspace copy first.")
    seconds: float = Field(3.0, ge=0.5, le=20.0, description="Measurement time budget.")


@tool(
    "microbench",
    "Time two expressions interleaved in a sandboxed copy of the workspace; speedup with 95% CI.",
    Microbench,
)
def microbench(p: Microbench, ctx: ToolContext) -> ToolResult:
    from infra_agent.feedback.bench import compare_samples

    _compile_check(p.setup, "exec", "setup")
    for what, code in (("baseline", p.baseline), ("candidate", p.candidate)):
        _compile_check(code, "eval", what)
    script = _script(
        _MICROBENCH, SETUP=textwrap.dedent(p.setup), BASE=p.baseline, CAND=p.candidate,
        MIN_SAMPLE_S=0.005, BUDGET_S=p.seconds,
    )  # fmt: skip
    out = run_in_sandbox(ctx, script, p.patch_id, timeout_s=60 + 3 * p.seconds)
    data = json.loads(out)
    comparison = compare_samples(
        data["baseline"], data["candidate"], higher_is_better=False, paired=True
    )
    return ToolResult(
        content=f"microbench (seconds per call, {data['iterations']} calls per sample): {comparison.render()}",
        data=comparison.model_dump(mode="json"),
    )


class AccuracyDiff(BaseModel):
    setup: str = Field(
        description="Python run once first (imports from workspace modules, inputs)."
    )
    baseline: str = Field(description="Expression giving a tensor or a dict of named tensors.")
    candidate: str = Field(description="The same computation by the other path.")
    reference: str | None = Field(None, description="Optional float64 reference expression.")
    patch_id: str | None = Field(None, description="Apply this patch to the workspace copy first.")


@tool(
    "accuracy_diff",
    "Compare two execution paths' tensors (and a float64 reference): where they diverge and by how much.",
    AccuracyDiff,
)
def accuracy_diff(p: AccuracyDiff, ctx: ToolContext) -> ToolResult:
    import torch

    from infra_agent.feedback.accuracy import compare_paths

    _compile_check(p.setup, "exec", "setup")
    for what, code in (
        ("baseline", p.baseline),
        ("candidate", p.candidate),
        ("reference", p.reference),
    ):
        if code:
            _compile_check(code, "eval", what)
    script = _script(
        _ACCURACY,
        SETUP=textwrap.dedent(p.setup),
        BASE=p.baseline,
        CAND=p.candidate,
        REF=p.reference or "",
    )
    out = run_in_sandbox(ctx, script, p.patch_id, timeout_s=120)
    tensors = torch.load(io.BytesIO(out), weights_only=True)  # tensors only: nothing runs on load
    report = compare_paths(
        tensors["baseline"], tensors["candidate"], reference=tensors.get("reference")
    )
    return ToolResult(content=report.render(), data=report.model_dump(mode="json"))


class Profile(BaseModel):
    setup: str = Field(
        description="Python run once first (imports from workspace modules, inputs)."
    )
    code: str = Field(description="Expression to profile, e.g. 'attention(q, k, v)'.")
    patch_id: str | None = Field(None, description="Apply this patch to the workspace copy first.")
    repeat: int = Field(5, ge=1, le=100)
    overlaps: list[tuple[str, str]] = Field(
        default_factory=list,
        description="Pairs of op-name regexes [A, B]: how much of A's time overlaps B.",
    )


@tool(
    "profile",
    "Profile an expression (torch.profiler timeline of every thread, by name): time by op "
    "class, top ops, gaps, overlaps.",
    Profile,
)
def profile(p: Profile, ctx: ToolContext) -> ToolResult:
    import tempfile
    from pathlib import Path

    from infra_agent.feedback.timeline import load_trace, summarize

    _compile_check(p.setup, "exec", "setup")
    _compile_check(p.code, "eval", "code")
    script = _script(_PROFILE, SETUP=textwrap.dedent(p.setup), STMT=p.code, REPEAT=p.repeat)
    extra = [RESULT_FILE + ".wall", RESULT_FILE + ".threads"]
    trace, wall, meta = run_in_sandbox(ctx, script, p.patch_id, timeout_s=120, extra=extra)
    threads = json.loads(meta)
    names = {int(tid): name for tid, name in threads["names"].items()}
    with tempfile.TemporaryDirectory(prefix="infra-agent-trace-") as tmp:
        path = Path(tmp) / "trace.json"
        path.write_bytes(trace)
        summary = summarize(
            load_trace(path, thread_names=names), overlaps=p.overlaps,
            source="torch.profiler (sandbox)",
        )  # fmt: skip
    if not threads["all"]:
        summary.warnings.append("this torch records only the thread that called the code")
    wall_ms = float(wall) * 1e3
    return ToolResult(
        content=f"wall time per call {wall_ms:.3f} ms\n{summary.render()}",
        data={"wall_ms": wall_ms, "summary": summary.model_dump(mode="json")},
    )


INSTRUMENT_TOOLS: list[Tool] = [microbench, accuracy_diff, profile]  # type: ignore[type-arg]
