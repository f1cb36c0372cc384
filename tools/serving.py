"""Serving tools (serving tasks): the live system's numbers, end to end and inside the server.

Each is a look (`tools.looks`): it runs the task's server with a patch (a source patch, knobs,
or both; default the baseline), started as an experiment starts an arm's and kept for later
looks at the same patch, and drives the task's own workload through it (its harness's sessions
and load: what run_experiment sends, unless the call gives another shape):

- `serving_workload`: throughput, TTFT/TPOT percentiles and failures
  (`serving.load.metrics.RunMetrics.render`);
- `server_steps`: the scheduler's own step statistics during the workload (`serving.instruments.steps`):
  running and queued requests, tokens per batch, prefill vs decode steps, time per step;
- `server_profile` (`tools.server_trace`): py-spy and the GIL tracer on the server's processes.

A look is one sample: not a verdict (run_experiment repeats, interleaves and checks health and
accuracy), and each answer ends with a line that says so; looks have a budget of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.tools.looks import Look

WORKLOAD_DEFAULT = "default: the task's workload, as run_experiment sends it (describe_task)"


PATCH_ID = (
    "A patch to look at, source or knobs (default: the baseline): its server is started once "
    "and kept for later looks at it."
)
KNOBS = "Knob values for this look on top of the patch's (a source patch with other knobs)."
LOOK = (
    "A look: one sample, not a verdict; counts against the run's looks budget, not its experiments."
)


class ServingWorkload(BaseModel):
    patch_id: str | None = Field(None, description=PATCH_ID)
    knobs: dict[str, Any] | None = Field(None, description=KNOBS)
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
    """The `serving.load.generator.LoadSpec` the task's harness sends, with the call's overrides."""
    knobs: dict[str, Any]
    label: str
    """The patch ('baseline', or its id and what it changes) and the workload sent, in words."""
    look: Look
    """The look: its patch, its server (reused or started) and its place in the looks budget."""
    harness: ServingHarness
    """The task's harness with the call's overrides (more sessions of the same shape)."""


@contextmanager
def task_server(
    ctx: ToolContext, patch_id: str | None, *, knobs: dict[str, Any] | None = None, **overrides: Any
) -> Iterator[TaskRun]:
    """A look (`tools.looks`): the task's server with the patch (source, knobs, or both with
    `knobs`), kept for later looks at it, and the task's workload (with `overrides`) to send it.
    Counts against the run's looks budget."""
    from infra_agent.tools.looks import Look, describe_patch, look_key, start_look_server, take_look
    from infra_agent.tools.workload import task_harness

    harness = task_harness(ctx, **overrides)
    patch, effective, number = take_look(ctx, patch_id, knobs)
    kept, reused = ctx.look_servers.get(
        look_key(patch, effective), lambda: start_look_server(ctx, patch, effective)
    )
    look = Look(
        patch_id=patch_id, patch=describe_patch(patch_id, patch), knobs=dict(knobs or {}),
        number=number, limit=ctx.looks_limit, reused=reused, start_s=round(kept.start_s, 1),
        started_as=[] if reused else kept.started_as,
    )  # fmt: skip
    label = f"{look.patch} on {harness.workload(effective).summary.split(';')[0]}"
    with kept.running() as server:
        sessions = harness.sessions(int(harness.params["num_prompts"]), seed=1)
        yield TaskRun(server, sessions, harness.load(1), effective, label, look, harness)


@instrument(
    "serving_workload",
    "Run the task's workload (or the shape you give) on the task's server, patched or not, and "
    f"report throughput, TTFT/TPOT percentiles and failures. {LOOK}",
    ServingWorkload,
    needs="serving",
)
def serving_workload(p: ServingWorkload, ctx: ToolContext) -> ToolResult:
    from infra_agent.serving.instruments.live import run_counted
    from infra_agent.serving.load.metrics import summarize

    with task_server(ctx, **p.model_dump()) as run:
        result = run_counted(run.server, run.sessions, run.load)  # as harness.sample counts
        network = run.server.network.render()
        filesystem = run.server.filesystem.render()
    metrics = summarize(result)
    return ToolResult(
        content=(
            f"{run.label}: {metrics.render()}\nserver network: {network}; file system: "
            f"{filesystem}\n{run.look.render()}"
        ),
        data={
            **metrics.model_dump(mode="json"),
            "output_tokens_per_cpu_s": metrics.output_tokens_per_cpu_s,
            "look": run.look.model_dump(mode="json"),
            "server_network": network,
            "server_filesystem": filesystem,
        },
    )


@instrument(
    "server_steps",
    "Run the task's workload (or the shape you give) on the task's server, patched or not, and "
    "report what happened inside it from the scheduler's own step statistics: running and "
    "queued requests per step, tokens per batch, prefill vs decode steps, time per step (by "
    "batch size), as a summary and a short timeline. Shows queueing behind the running-request "
    f"cap, batch sizes, and where the time goes. {LOOK}",
    ServingWorkload,
    needs="serving",
)
def server_steps(p: ServingWorkload, ctx: ToolContext) -> ToolResult:
    from infra_agent.serving.instruments.live import describe
    from infra_agent.serving.instruments.steps import run_with_steps

    with task_server(ctx, **p.model_dump()) as run:
        result, report = run_with_steps(run.server, run.sessions, run.load, knobs=run.knobs)
    return ToolResult(
        content=f"{report.render()}\n{run.label}: {describe(result)}\n{run.look.render()}",
        data={**report.model_dump(mode="json"), "look": run.look.model_dump(mode="json")},
    )
