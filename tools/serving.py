"""Serving tools (serving tasks): the live system's numbers, end to end and inside the server.

Both start the task's deployment with the task's default knobs overlaid by a knob patch, drive
the task's own workload through it (its harness's sessions and load: what run_experiment sends,
unless the call gives another shape) and stop it:

- `serving_workload`: throughput, TTFT/TPOT percentiles and failures
  (`serving.metrics.RunMetrics.render`);
- `server_steps`: the scheduler's own step statistics during the workload (`serving.steps`):
  running and queued requests, tokens per batch, prefill vs decode steps, time per step.

One run is one sample: a quick look at a configuration, not a verdict (run_experiment repeats,
interleaves and checks health and accuracy).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.serving.harness import ServingHarness

WORKLOAD_DEFAULT = "default: the task's workload, as run_experiment sends it (describe_task)"


class ServingWorkload(BaseModel):
    patch_id: str | None = Field(None, description="A knob patch to run (default: the baseline).")
    num_prompts: int | None = Field(None, ge=1, le=2000, description=f"Requests ({WORKLOAD_DEFAULT}).")  # fmt: skip
    input_len: int | None = Field(None, ge=1, le=32768, description=f"Prompt tokens ({WORKLOAD_DEFAULT}).")  # fmt: skip
    output_len: int | None = Field(None, ge=1, le=8192, description=f"Generated tokens per request ({WORKLOAD_DEFAULT}).")  # fmt: skip
    max_concurrency: int | None = Field(None, ge=1, le=2000, description=f"At most this many in flight ({WORKLOAD_DEFAULT}).")  # fmt: skip
    request_rate: float | None = Field(None, gt=0, description=f"Requests per second ({WORKLOAD_DEFAULT}).")  # fmt: skip


@dataclass(frozen=True)
class TaskRun:
    """A started server of the task's deployment and the load a serving tool sends it."""

    server: Any
    sessions: list[Any]
    load: Any
    """The `serving.workload.LoadSpec` the task's harness sends, with the call's overrides."""
    knobs: dict[str, Any]
    label: str
    """The arm ('baseline' or the patch's knobs) and the workload sent, in words."""


def task_harness(ctx: ToolContext, **overrides: Any) -> ServingHarness:
    """The task's serving harness with the run's parameters and the call's workload overrides
    (None: the task's own value) on top: its `load` and `sessions` are what the tools send."""
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.tools.workload import harness_of

    harness = harness_of(ctx.task, ctx.params)
    if not isinstance(harness, ServingHarness):
        raise UserError(f"task {ctx.task.name} is not a serving task (no server to start)")
    harness.params.update({k: v for k, v in overrides.items() if v is not None})
    return harness


@contextmanager
def task_server(
    ctx: ToolContext, patch_id: str | None, *, steps: bool = False, **overrides: Any
) -> Iterator[TaskRun]:
    """The task's deployment started with the patch's knobs, and the task's workload (with
    `overrides`) to send it; with `steps`, a server that logs every scheduler step."""
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.serving.overlay import build_overlay
    from infra_agent.serving.server import Server
    from infra_agent.serving.steps import STEP_KNOBS, instrumented
    from infra_agent.tasks.patch import effective_knobs
    from infra_agent.tasks.tree import workspace_folder

    harness = task_harness(ctx, **overrides)
    patch = ctx.patch(patch_id) if patch_id else None
    if patch is not None and patch.kind != "knobs":
        raise UserError("serving tools run knob patches; run_experiment verifies source patches")
    knobs = effective_knobs(patch, ctx.task.manifest)
    spec = harness.deployment
    arm = ", ".join(f"{k}={v}" for k, v in sorted((patch.knobs if patch else {}).items()))
    label = f"{arm or 'baseline'} on {harness.workload(knobs).summary.split(';')[0]}"
    with tempfile.TemporaryDirectory(prefix="infra-agent-serving-") as tmp:
        with workspace_folder(ctx.task) as folder:  # the task's baseline: its injected fault
            overlay = build_overlay(
                folder,
                ServingHarness.overlay_files(folder),
                Path(tmp) / "overlay",
                spec.sglang_version,
            )
        if steps:
            spec = instrumented(spec)
        launch = {**knobs, **STEP_KNOBS} if steps else knobs
        with Server.start(spec, Path(tmp), knobs=launch, overlay=overlay) as server:
            sessions = harness.sessions(int(harness.params["num_prompts"]), seed=1)
            yield TaskRun(server, sessions, harness.load(1), knobs, label)


@instrument(
    "serving_workload",
    "Start the task's server (optionally with a knob patch), run the task's workload (or the "
    "shape you give), report throughput, TTFT/TPOT percentiles and failures. One sample, not a "
    "verdict.",
    ServingWorkload,
    needs="serving",
)
def serving_workload(p: ServingWorkload, ctx: ToolContext) -> ToolResult:
    from infra_agent.serving.metrics import summarize
    from infra_agent.serving.workload import run_workload

    with task_server(ctx, **p.model_dump()) as run:
        result = run.server.call(run_workload, run.sessions, run.load)
        network = run.server.network.render()
        filesystem = run.server.filesystem.render()
    metrics = summarize(result)
    return ToolResult(
        content=f"{run.label}: {metrics.render()}\nserver network: {network}; file system: {filesystem}",
        data={
            **metrics.model_dump(mode="json"),
            "server_network": network,
            "server_filesystem": filesystem,
        },
    )


@instrument(
    "server_steps",
    "Start the task's server (optionally with a knob patch), run the task's workload (or the "
    "shape you give), and report what "
    "happened inside it from the scheduler's own step statistics: running and queued requests "
    "per step, tokens per batch, prefill vs decode steps, time per step (by batch size), as a "
    "summary and a short timeline. Shows queueing behind the running-request cap, batch sizes, "
    "and where the time goes.",
    ServingWorkload,
    needs="serving",
)
def server_steps(p: ServingWorkload, ctx: ToolContext) -> ToolResult:
    from infra_agent.serving.instruments import describe
    from infra_agent.serving.steps import run_with_steps

    with task_server(ctx, steps=True, **p.model_dump()) as run:
        result, report = run_with_steps(run.server, run.sessions, run.load, knobs=run.knobs)
    return ToolResult(
        content=f"{report.render()}\n{run.label}: {describe(result)}",
        data=report.model_dump(mode="json"),
    )
