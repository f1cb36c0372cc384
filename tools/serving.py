"""Serving tools (serving tasks): the live system's numbers, end to end and inside the server.

Both start the task's deployment with the task's default knobs overlaid by a knob patch, drive a
random-length workload through it and stop it:

- `serving_workload`: throughput, TTFT/TPOT percentiles and failures
  (`serving.metrics.RunMetrics.render`);
- `server_steps`: the scheduler's own step statistics during the workload (`serving.steps`):
  running and queued requests, tokens per batch, prefill vs decode steps, time per step.

One run is one sample: a quick look at a configuration, not a verdict (run_experiment repeats,
interleaves and checks health and accuracy).
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext


class ServingWorkload(BaseModel):
    patch_id: str | None = Field(None, description="A knob patch to run (default: the baseline).")
    num_prompts: int = Field(32, ge=1, le=2000)
    input_len: int = Field(64, ge=1, le=32768, description="Prompt tokens (random, up to this).")
    output_len: int = Field(32, ge=1, le=8192, description="Generated tokens per request.")
    request_rate: float | None = Field(
        None, gt=0, description="Requests per second (default: all at once)."
    )


@contextmanager
def task_server(
    p: ServingWorkload, ctx: ToolContext, *, steps: bool = False
) -> Iterator[tuple[Any, Any, dict[str, Any], str]]:
    """(server, sessions, knobs, label) of the task's deployment with the patch's knobs; with
    `steps`, a server that logs every scheduler step (`serving.steps`)."""
    from infra_agent.serving.datasets import random_sessions
    from infra_agent.serving.deployment import load_deployment
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.serving.overlay import build_overlay
    from infra_agent.serving.server import Server
    from infra_agent.serving.steps import STEP_KNOBS, instrumented
    from infra_agent.tasks.patch import effective_knobs
    from infra_agent.tasks.tree import workspace_folder

    task = ctx.task
    spec_path = task.root / "deployment.toml"
    if task.manifest.kind != "serving" or not spec_path.is_file():
        raise UserError(f"task {task.name} is not a serving task (no deployment.toml)")
    patch = ctx.patch(p.patch_id) if p.patch_id else None
    if patch is not None and patch.kind != "knobs":
        raise UserError("serving tools run knob patches; run_experiment verifies source patches")
    knobs = effective_knobs(patch, task.manifest)
    vocab = int(task.manifest.params.get("vocab_size", 1024))
    spec = load_deployment(spec_path)
    label = (
        ", ".join(f"{k}={v}" for k, v in sorted((patch.knobs if patch else {}).items()))
        or "baseline"
    )
    with tempfile.TemporaryDirectory(prefix="infra-agent-serving-") as tmp:
        with workspace_folder(task) as folder:  # the task's baseline: its injected fault
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
            sessions = random_sessions(
                p.num_prompts, p.input_len, p.output_len, vocab_size=vocab, seed=1
            )
            yield server, sessions, knobs, label


def _load(p: ServingWorkload) -> Any:
    from infra_agent.serving.workload import LoadSpec

    return LoadSpec(request_rate=p.request_rate or math.inf)


@instrument(
    "serving_workload",
    "Start the task's server (optionally with a knob patch), run a workload, report throughput, "
    "TTFT/TPOT percentiles and failures. One sample, not a verdict.",
    ServingWorkload,
    needs="serving",
)
def serving_workload(p: ServingWorkload, ctx: ToolContext) -> ToolResult:
    from infra_agent.serving.metrics import summarize
    from infra_agent.serving.workload import run_workload

    with task_server(p, ctx) as (server, sessions, _, label):
        result = server.call(run_workload, sessions, _load(p))
        network = server.network.render()
        filesystem = server.filesystem.render()
    metrics = summarize(result)
    return ToolResult(
        content=f"{label}: {metrics.render()}\nserver network: {network}; file system: {filesystem}",
        data={
            **metrics.model_dump(mode="json"),
            "server_network": network,
            "server_filesystem": filesystem,
        },
    )


@instrument(
    "server_steps",
    "Start the task's server (optionally with a knob patch), run a workload, and report what "
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

    with task_server(p, ctx, steps=True) as (server, sessions, knobs, label):
        result, report = run_with_steps(server, sessions, _load(p), knobs=knobs)
    return ToolResult(
        content=f"{report.render()}\n{label}: {describe(result)}",
        data=report.model_dump(mode="json"),
    )
