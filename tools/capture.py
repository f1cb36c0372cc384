"""`capture`: a named SGLang function's real arguments, recorded on the live server while the
task's workload runs (`serving.instruments.capture`), for `microbench` and `accuracy_diff` to replay
(`captured=<capture id>`, `tools.replay`).

The server is the task's, patched or not, started as an experiment's arm is (overlay of the
workspace copy, knobs, confinement, warm-up) with the hook in its overlay; the workload is the
task's own (its harness's sessions and load), profiled meanwhile (py-spy on the scheduler) so a
function that is never called can be answered with the functions that do take the time. The
server is stopped after: a capture is a look (it counts against the looks budget) whose server
is not kept (the hook stays in a server that looks would measure).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.serving.instruments.capture import CaptureLimits, CaptureRecord, Target
    from infra_agent.tasks.patch import Patch

RECORD_FILE = "capture.json"


class CaptureParams(BaseModel):
    function: str = Field(
        description="The SGLang function, 'sglang.module.path:function' or "
        "'sglang.module.path:Class.method', e.g. 'sglang.srt.layers.layernorm:RMSNorm.forward'."
    )
    patch_id: str | None = Field(
        None, description="Capture on the server with this patch (default: the baseline)."
    )
    calls: int = Field(12, ge=2, le=64, description="Calls kept: the first half, the rest spread.")
    num_prompts: int | None = Field(
        None, ge=1, le=2000, description="Requests (default: the task's workload)."
    )


def captures_folder(ctx: ToolContext) -> Path:
    """Where this run's captures lie: beside the run store, under captures/RUN_ID."""
    from infra_agent.config import default_data_dir

    store_path = getattr(ctx.store, "path", None)
    base = Path(store_path).parent if store_path else default_data_dir()
    return base / "captures" / ctx.run_id


def load_capture(ctx: ToolContext, capture_id: str) -> tuple[CaptureRecord, Path]:
    """A capture of this run by id, and its folder; a one-line error naming the known ones."""
    from infra_agent.serving.instruments.capture import CaptureRecord

    root = captures_folder(ctx)
    folder = root / capture_id
    if not capture_id.isalnum() or not (folder / RECORD_FILE).is_file():
        known = sorted(p.name for p in root.glob("*") if (p / RECORD_FILE).is_file())
        raise UserError(
            f"no capture '{capture_id}' in this run (captures: {', '.join(known) or 'none yet'}); "
            "run capture(function=...) first"
        )
    return CaptureRecord.model_validate_json((folder / RECORD_FILE).read_text()), folder


@instrument(
    "capture",
    "Record the real arguments (shapes, dtypes, values) of a named SGLang function while the "
    "task's workload runs on the task's server (patched or not); then microbench and "
    "accuracy_diff replay those calls with captured=<capture id>, baseline vs a patch, in the "
    "real SGLang package. Counts as a look.",
    CaptureParams,
    needs="serving",
)
def capture(p: CaptureParams, ctx: ToolContext) -> ToolResult:
    from infra_agent.serving.instruments.capture import CaptureLimits, Target
    from infra_agent.tools.looks import describe_patch, take_look

    target = Target.parse(p.function)
    harness = _harness(ctx, p.num_prompts)
    _check_installed(ctx, target, p.patch_id, harness.deployment.sglang_version)
    patch, knobs, _ = take_look(ctx, p.patch_id, None)
    limits = CaptureLimits(calls=p.calls)
    label = describe_patch(p.patch_id, patch)
    record = run_capture(ctx, harness, patch, knobs, target, limits, label)
    return ToolResult.of(record)


def _check_installed(ctx: ToolContext, target: Target, patch_id: str | None, version: str) -> None:
    """An unknown module or function is refused before a look is spent: checked against the
    installed package unless the patch changes that module (then the arm's copy decides)."""
    from infra_agent.serving.instruments.capture import check_defined, module_source

    if patch_id is not None and any(f in ctx.patch(patch_id).files for f in target.relpaths()):
        return
    check_defined(module_source(Path("/nonexistent"), target, version)[1], target)


def _harness(ctx: ToolContext, num_prompts: int | None) -> ServingHarness:
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.tools.workload import harness_of

    harness = harness_of(ctx.task, ctx.params)
    if not isinstance(harness, ServingHarness):
        raise UserError(f"task {ctx.task.name} is not a serving task (no server to capture on)")
    if num_prompts is not None:
        harness.params["num_prompts"] = num_prompts
    return harness


def run_capture(
    ctx: ToolContext,
    harness: ServingHarness,
    patch: Patch | None,
    knobs: dict[str, Any],
    target: Target,
    limits: CaptureLimits,
    label: str,
) -> CaptureRecord:
    """Start the hooked server, run the task's workload, keep the calls; the server is stopped."""
    from infra_agent.experiments.arms import arm_set
    from infra_agent.serving.instruments.capture import (
        CaptureRecord,
        instrument_workspace,
        read_capture,
    )
    from infra_agent.serving.server import ServerFailed
    from infra_agent.tools.sandboxed import open_sandbox

    arms = arm_set(ctx.task)
    try:
        box = open_sandbox(ctx, patch)
        out = Path(box.root) / ".serving" / "capture"
        instrument_workspace(Path(box.root), target, out, limits, harness.deployment.sglang_version)
        out.mkdir(parents=True)
        out.chmod(0o777)  # the server's own uid writes there from its first import (a private copy)
        arm = arms.open("baseline" if patch is None else "candidate", box, knobs, harness.params)
        try:
            harness.prepare(arm)
            server = harness.server(arm)
            uid = server.confinement.uid if server.confinement else os.getuid()
            os.chown(out, uid, uid)
            (out / "armed").touch()  # the warm-up's calls are not kept
            n = int(harness.params["num_prompts"])
            workload, top = _run(server, harness.sessions(n, seed=1), harness.load(1))
            seen, calls, errors = read_capture(out)
            if not calls:
                raise UserError(_not_called(target, seen, n, errors, top))
            dest = _new_folder(captures_folder(ctx))
            capture_id = dest.name
            for call in calls:
                shutil.copyfile(out / call.file, dest / call.file)
        finally:
            harness.finish(arm)
    except ServerFailed as exc:
        tail = "\n".join(exc.log_tail.strip().splitlines()[-8:])
        raise UserError(f"the server did not start with the capture hook: {exc}\n{tail}") from exc
    finally:
        arms.close()
    record = CaptureRecord(
        capture_id=capture_id, function=target.name, label=label, workload=workload,
        calls_seen=seen, calls=calls, folder=str(dest), errors=errors,
    )  # fmt: skip
    (dest / RECORD_FILE).write_text(record.model_dump_json(indent=1))
    return record


def _new_folder(root: Path) -> Path:
    """The next capture's folder under `root`: c1, c2, ... (a script can name them)."""
    root.mkdir(parents=True, exist_ok=True)
    n = 1 + sum(1 for p in root.iterdir() if p.name[:1] == "c" and p.name[1:].isdigit())
    while True:
        try:
            (root / f"c{n}").mkdir()
            return root / f"c{n}"
        except FileExistsError:
            n += 1


def _run(server: Any, sessions: list[Any], load: Any) -> tuple[str, list[str]]:
    """The workload, the scheduler profiled meanwhile: (one line about it, the functions with
    the most self time)."""
    from infra_agent.serving.instruments.live import describe
    from infra_agent.serving.instruments.tracing import (
        ProcessProfile,
        package_dirs_of,
        trace_during,
    )

    started = time.monotonic()
    traces, result = trace_during(server, sessions, load, ["scheduler"], gil_s=None)
    rows = ProcessProfile.of(traces[0], package_dirs_of(server)).top_self
    top = [f"{r.where.rsplit('/', 1)[-1]} {r.self_share:.0%}" for r in rows]
    if not top:  # e.g. a workload over before py-spy attached on a loaded machine
        top = [f"none sampled ({'; '.join(traces[0].errors) or 'no SGLang frames'})"]
    line = (
        describe(result) if result is not None else f"workload {time.monotonic() - started:.0f} s"
    )
    return line, top


def _not_called(target: Target, seen: int, n: int, errors: list[str], top: list[str]) -> str:
    if errors:
        return f"{target.name}: {seen} calls counted, none recorded: {errors[0]}"
    hot = ", ".join(top)
    return (
        f"{target.name} was not called during the workload ({n} requests); functions with the "
        f"most self time in the scheduler: {hot}"
    )


def describe_calls(record: CaptureRecord) -> str:
    """'RMSNorm.forward, 12 calls captured (arg1: bfloat16[32,64] ...)' for a replay's text."""
    from infra_agent.serving.instruments.capture import signature

    shapes = sorted({signature(c) for c in record.calls}, key=len)
    more = f" +{len(shapes) - 1} more shapes" if len(shapes) > 1 else ""
    return (
        f"{record.function.split(':')[1]}, {len(record.calls)} calls captured "
        f"({shapes[0] if shapes else '?'}{more})"
    )
