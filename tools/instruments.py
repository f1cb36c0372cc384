"""Instrument tools: the model's hypotheses tested on the task's code, inside a sandbox.

Each tool runs a small script the model writes (setup code and expressions) against a private,
network-less copy of the workspace (optionally with one of its patches applied), in the same
sandbox the experiments use, with the harness and this package hidden. The raw numbers come back
to this process, where the instruments of `feedback/` turn them into a verdict and a short text:

- `microbench`: two expressions, each in its own sandboxed process (the candidate's in a patched
  copy when a patch is named), timed by the real bench engine (`feedback.bench.run_bench`:
  warm-up, calibration, interleaved samples, adaptive stopping); speedup with a 95% CI.
- `accuracy_diff`: two (or three, with a float64 reference) expressions evaluated to tensors or
  dicts of named tensors; `feedback.accuracy.compare_paths` finds where they part ways and says
  whether the candidate would pass the experiment's accuracy rule.
- `profile`: a `torch.profiler` timeline of a statement, every thread's ops on a track named by
  the thread, summarized by `feedback.timeline`: time by op class, the top ops, launch gaps,
  and overlaps between op groups.

With no setup or expressions, microbench and accuracy_diff default to the experiment's own
workload (the harness's `workload()`, tasks.workload): its setup, the call it measures, its
float64 reference.
"""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tasks.workload import Workload
from infra_agent.tools.base import Tool, ToolResult, tool
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.feedback.accuracy import ToleranceRule
    from infra_agent.sandboxes.base import Sandbox
    from infra_agent.tasks.patch import Patch

RESULT_FILE = ".infra_agent_instrument.out"

_PRELUDE = """\
import json, sys, time
sys.path.insert(0, ".")
ns = {}
exec(compile(SETUP, "<setup>", "exec"), ns)
"""

_BENCH_WORKER = """\
import sys, time
sys.path.insert(0, ".")
ns = {}
exec(compile(SETUP, "<setup>", "exec"), ns)
NOW = time.thread_time_ns if CLOCK == "cpu" else time.perf_counter_ns
f = eval(compile("lambda: (" + EXPR + ")", "<" + LABEL + ">", "eval"), ns)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    try:
        t0 = NOW()
        for _ in range(n):
            f()
        dt = NOW() - t0
    except Exception as exc:
        print("error " + (type(exc).__name__ + ": " + str(exc)).replace("\\n", " "), flush=True)
        continue
    print(repr(dt / 1e9 / n), flush=True)
"""
"""One arm of `microbench` inside its sandbox: the worker protocol of feedback.bench (timed here
with perf_counter_ns, or thread_time_ns for clock 'cpu'; the bench engine in the tool's process decides iterations and stopping)."""

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
out = {label: named(eval(code, ns), label) for label, code in EXPRS.items()}
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

    patch = ctx.patch(patch_id) if patch_id else None
    with open_sandbox(ctx, patch) as box:
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


def compile_check(code: str, mode: str, what: str) -> None:
    try:
        compile(code, f"<{what}>", mode)
    except SyntaxError as exc:
        raise UserError(f"{what} is not valid Python ({exc.msg}, line {exc.lineno})") from exc


def open_sandbox(ctx: ToolContext, patch: Patch | None) -> Sandbox:
    """A sandboxed copy of the workspace (with `patch` applied); the caller cleans it up."""
    from infra_agent.experiments.arms import sandbox_spec
    from infra_agent.sandboxes import create_sandbox
    from infra_agent.tasks.patch import apply_patch
    from infra_agent.tasks.tree import workspace_folder

    with workspace_folder(ctx.task, patch.files if patch else ()) as folder:
        box = create_sandbox(ctx.sandbox, folder, sandbox_spec(ctx.task))
    try:
        if patch is not None:
            apply_patch(patch, ctx.task, box.root)
    except BaseException:
        box.cleanup()
        raise
    return box


class Arms(BaseModel):
    """What a two-arm instrument ran: the code of each arm and where it ran."""

    setup: str
    baseline: str
    candidate: str
    reference: str | None = None
    patch_id: str | None = None
    """The candidate ran in a workspace copy with this patch (the baseline never does)."""
    workload: Workload | None = None
    """The experiment's workload, when the setup or an expression came from it."""

    def render(self) -> str:
        where = f"candidate with patch {self.patch_id[:12]}" if self.patch_id else "no patch"
        text = (
            f"baseline `{_short(self.baseline)}` vs candidate `{_short(self.candidate)}` ({where})"
        )
        if self.workload is not None:
            text = f"on the experiment's workload (describe_task shows it): {text}"
        return text


def _short(code: str, limit: int = 100) -> str:
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."


def _arms(
    ctx: ToolContext,
    setup: str | None,
    baseline: str | None,
    candidate: str | None,
    patch_id: str | None,
    reference: str | None = None,
    *,
    want_reference: bool = False,
) -> tuple[Arms, Patch | None]:
    """Fill what the model left out from the experiment's workload (tasks.workload): the setup,
    the measured call for the baseline (task knobs) and for the candidate (the patch's knobs),
    and the float64 reference. Checks every piece of code compiles."""
    patch = ctx.patch(patch_id) if patch_id else None
    workload = None
    if setup is None or baseline is None:
        from infra_agent.tools.workload import task_workload

        published = task_workload(ctx)
        if not published.ready:
            raise UserError(
                f"task {ctx.task.name} publishes no ready setup for its workload; give setup, "
                "baseline and candidate"
            )
        workload = published
        if baseline is None:
            if candidate is None:  # the measured call with the knobs the patch's arm would run
                candidate = task_workload(ctx, patch).call if patch else published.call
            if want_reference and reference is None and published.reference:
                reference = published.reference
            baseline = published.call
        setup = published.setup if setup is None else setup
    candidate = baseline if candidate is None else candidate
    arms = Arms(
        setup=textwrap.dedent(setup),
        baseline=baseline,
        candidate=candidate,
        reference=reference,
        patch_id=patch_id,
        workload=workload,
    )
    compile_check(arms.setup, "exec", "setup")
    for what, code in (("baseline", baseline), ("candidate", candidate), ("reference", reference)):
        if code:
            compile_check(code, "eval", what)
    return arms, patch


class Microbench(BaseModel):
    setup: str | None = Field(
        None,
        description="Python run once first (imports from workspace modules, inputs). "
        "Default: the experiment's own workload setup (see describe_task).",
    )
    baseline: str | None = Field(
        None,
        description="Expression timed as the baseline, e.g. 'f(x)'. Default: the call the "
        "experiment measures.",
    )
    candidate: str | None = Field(
        None,
        description="Expression timed as the candidate. Default: the baseline expression (with "
        "patch_id: in the patched copy, with the patch's knobs).",
    )
    patch_id: str | None = Field(
        None, description="Run the candidate in a workspace copy with this patch applied."
    )
    seconds: float = Field(3.0, ge=0.5, le=20.0, description="Measurement time budget.")
    clock: Literal["wall", "cpu"] = Field(
        "wall",
        description="'wall' (what run_experiment's harness clock sees) or 'cpu' (the arm's "
        "thread CPU time: far less noisy on a busy machine, for single-threaded CPU-bound code).",
    )


@tool(
    "microbench",
    "Time two expressions interleaved (warm-up, calibration, adaptive stopping) in sandboxed "
    "workspace copies; speedup with 95% CI. With no inputs: on the experiment's own workload.",
    Microbench,
)
def microbench(p: Microbench, ctx: ToolContext) -> ToolResult:
    import functools
    import sys
    from contextlib import ExitStack

    from infra_agent.feedback.bench import PipeTarget, run_bench

    arms, patch = _arms(ctx, p.setup, p.baseline, p.candidate, p.patch_id)
    with ExitStack() as stack:
        targets = []
        for label, code, arm_patch in (
            ("baseline", arms.baseline, None),
            ("candidate", arms.candidate, patch),
        ):
            box = open_sandbox(ctx, arm_patch)
            stack.callback(box.cleanup)
            script = _script(_BENCH_WORKER, SETUP=arms.setup, EXPR=code, LABEL=label, CLOCK=p.clock)
            box.write_file("_infra_agent_bench.py", script.encode())
            proc = box.spawn([sys.executable, "_infra_agent_bench.py"])
            targets.append(
                PipeTarget(
                    proc.stdin,
                    proc.stdout,
                    name=f"the {label} arm",
                    timer="sandbox:"
                    + ("thread_time_ns" if p.clock == "cpu" else "perf_counter_ns"),
                    describe_exit=functools.partial(_stderr_tail, proc.stderr_path),
                )
            )
        result = run_bench(targets[0], targets[1], budget_s=p.seconds)
    return ToolResult(  # the record: `feedback bench`'s BenchResult keys, plus "arms"
        content=f"microbench {arms.render()}\n{result.render()}",
        data=result.model_dump(mode="json") | {"arms": arms.model_dump(mode="json")},
    )


def _stderr_tail(path: Path | None, lines: int = 6) -> str:
    if path is None or not Path(path).is_file():
        return ""
    return "\n".join(Path(path).read_text(errors="replace").strip().splitlines()[-lines:])


class AccuracyDiff(BaseModel):
    setup: str | None = Field(
        None,
        description="Python run once first (imports from workspace modules, inputs). "
        "Default: the experiment's own workload setup.",
    )
    baseline: str | None = Field(
        None,
        description="Expression giving a tensor or a dict of named tensors. Default: the call "
        "the experiment measures.",
    )
    candidate: str | None = Field(
        None,
        description="The same computation by the other path. Default: the baseline expression "
        "(with patch_id: in the patched copy).",
    )
    reference: str | None = Field(
        None,
        description="Optional float64 reference expression. Default with the experiment's call: "
        "the workload's float64 reference.",
    )
    patch_id: str | None = Field(
        None, description="Evaluate the candidate in a workspace copy with this patch applied."
    )


@tool(
    "accuracy_diff",
    "Compare two execution paths' tensors (and a float64 reference) as relative RMS and max "
    "error, against the experiment's accuracy rule (would pass/fail). With no inputs: on the "
    "experiment's own workload.",
    AccuracyDiff,
)
def accuracy_diff(p: AccuracyDiff, ctx: ToolContext) -> ToolResult:
    import torch

    from infra_agent.feedback.accuracy import compare_paths

    arms, patch = _arms(
        ctx, p.setup, p.baseline, p.candidate, p.patch_id, p.reference, want_reference=True
    )
    exprs = {"baseline": arms.baseline, "candidate": arms.candidate}
    if arms.reference:
        exprs["reference"] = arms.reference
    runs: list[tuple[dict[str, str], Patch | None]] = [(exprs, None)]
    if patch is not None:  # the baseline (and reference) unpatched, the candidate patched
        runs = [({k: v for k, v in exprs.items() if k != "candidate"}, None),
                ({"candidate": arms.candidate}, patch)]  # fmt: skip
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for wanted, arm_patch in runs:
        script = _script(_ACCURACY, SETUP=arms.setup, EXPRS=wanted)
        with open_sandbox(ctx, arm_patch) as box:
            out = _run_script(box, script, timeout_s=120)
        tensors.update(torch.load(io.BytesIO(out), weights_only=True))  # tensors only
    rule = _rule(ctx, arms.workload, tensors["baseline"])
    report = compare_paths(
        tensors["baseline"], tensors["candidate"], reference=tensors.get("reference"), rule=rule
    )
    return ToolResult(  # the record: AccuracyReport's keys (rule, would_pass...), plus "arms"
        content=f"accuracy_diff {arms.render()}\n{report.render()}",
        data=report.model_dump(mode="json") | {"arms": arms.model_dump(mode="json")},
    )


def _run_script(box: Sandbox, script: str, timeout_s: float) -> bytes:
    import sys

    box.write_file("_infra_agent_instrument.py", script.encode())
    result = box.exec([sys.executable, "_infra_agent_instrument.py"], timeout_s=timeout_s)
    if result.timed_out:
        raise UserError(f"the instrument script ran past {timeout_s:.0f} s and was killed")
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-6:])
        raise UserError(f"the instrument script failed (exit {result.returncode}):\n{tail}")
    return box.read_file(RESULT_FILE)


def _rule(ctx: ToolContext, workload: Workload | None, baseline: dict[str, Any]) -> ToleranceRule:
    """The accuracy rule run_experiment applies on this task: the harness's element-wise
    tolerance (from its workload) and the task's float64 rule (f64_factor, f64_floor)."""
    from infra_agent.feedback.accuracy import ToleranceRule, default_tolerance

    if workload is None:
        from infra_agent.tools.workload import task_workload

        workload = task_workload(ctx)
    tol = ctx.task.manifest.tolerance
    atol, rtol = workload.atol, workload.rtol
    if (atol is None) != (rtol is None):  # one given: the other is the dtype's default
        d_rtol, d_atol = default_tolerance(*{t.dtype for t in baseline.values()})
        atol = d_atol if atol is None else atol
        rtol = d_rtol if rtol is None else rtol
    return ToleranceRule(
        atol=atol,
        rtol=rtol,
        f64_factor=tol.f64_factor,
        f64_floor=tol.f64_floor,
        f64_error=workload.f64_error,
        source=f"task {ctx.task.name}'s tolerance",
    )


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

    compile_check(p.setup, "exec", "setup")
    compile_check(p.code, "eval", "code")
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
