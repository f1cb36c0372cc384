"""Run a serving workload against the task's server (serving tasks): the live system's numbers.

Starts the task's deployment with the task's default knobs overlaid by a knob patch, drives a
random-length workload through it, stops it, and returns throughput, TTFT/TPOT percentiles and
failures (`serving.metrics.RunMetrics.render`). One run is one sample: a quick look at a
configuration, not a verdict (run_experiment repeats, interleaves and checks health and accuracy).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.context import ToolContext


class ServingWorkload(BaseModel):
    patch_id: str | None = Field(None, description="A knob patch to run (default: the baseline).")
    num_prompts: int = Field(32, ge=1, le=2000)
    input_len: int = Field(64, ge=1, le=32768, description="Prompt tokens (random, up to this).")
    output_len: int = Field(32, ge=1, le=8192, description="Generated tokens per request.")
    request_rate: float | None = Field(
        None, gt=0, description="Requests per second (default: all at once)."
    )


@tool(
    "serving_workload",
    "Start the task's server (optionally with a knob patch), run a workload, report throughput, "
    "TTFT/TPOT percentiles and failures. One sample, not a verdict.",
    ServingWorkload,
    needs="serving",
)
def serving_workload(p: ServingWorkload, ctx: ToolContext) -> ToolResult:
    import math

    from infra_agent.serving.datasets import random_sessions
    from infra_agent.serving.deployment import load_deployment
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.serving.metrics import summarize
    from infra_agent.serving.overlay import build_overlay
    from infra_agent.serving.server import Server
    from infra_agent.serving.workload import LoadSpec, run_workload
    from infra_agent.tasks.patch import effective_knobs
    from infra_agent.tasks.tree import workspace_folder

    task = ctx.task
    spec_path = task.root / "deployment.toml"
    if task.manifest.kind != "serving" or not spec_path.is_file():
        raise UserError(f"task {task.name} is not a serving task (no deployment.toml)")
    patch = ctx.patch(p.patch_id) if p.patch_id else None
    if patch is not None and patch.kind != "knobs":
        raise UserError(
            "serving_workload runs knob patches; run_experiment verifies source patches"
        )
    knobs = effective_knobs(patch, task.manifest)
    vocab = int(task.manifest.params.get("vocab_size", 1024))
    spec = load_deployment(spec_path)
    with tempfile.TemporaryDirectory(prefix="infra-agent-serving-") as tmp:
        with workspace_folder(task) as folder:  # the task's baseline: its injected fault
            overlay = build_overlay(
                folder,
                ServingHarness.overlay_files(folder),
                Path(tmp) / "overlay",
                spec.sglang_version,
            )
        with Server.start(spec, Path(tmp), knobs=knobs, overlay=overlay) as server:
            sessions = random_sessions(
                p.num_prompts, p.input_len, p.output_len, vocab_size=vocab, seed=1
            )
            result = server.call(
                run_workload, sessions, LoadSpec(request_rate=p.request_rate or math.inf)
            )
            network = server.network.render()
            filesystem = server.filesystem.render()
    metrics = summarize(result)
    shown = (
        ", ".join(f"{k}={v}" for k, v in sorted((patch.knobs if patch else {}).items()))
        or "baseline"
    )
    return ToolResult(
        content=f"{shown}: {metrics.render()}\nserver network: {network}; file system: {filesystem}",
        data={
            **metrics.model_dump(mode="json"),
            "server_network": network,
            "server_filesystem": filesystem,
        },
    )
