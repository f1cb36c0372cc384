"""`server_profile`: the profiler and the GIL tracer attached to the live server's processes.

A look (`tools.looks`): on the task's server with a patch (source, knobs or both; default the
baseline), kept for later looks at it as `serving_workload`'s is, it runs the experiment's
published workload against it (or fewer requests / in flight, when asked) and,
while it runs, attaches py-spy to the chosen SGLang processes (`serving.instruments.tracing`, the path the
serving diagnosis uses): per process, the hottest SGLang functions by self and by total time
with their shares of the active samples and their hottest lines, names whole, and per thread its GIL states (holds / waits /
runs without it / idle) with who held the GIL while a thread waited. The typed
`serving.instruments.tracing.ServerProfile` is the data, with the look's record. A workload too short for
`MIN_SAMPLES` active samples is sent again, longer, and each process states its sampling error. A look is one sample, not a
verdict, and counts against the run's looks budget.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext
from infra_agent.tools.serving import KNOBS, LOOK, PATCH_ID, task_server

Process = Literal["scheduler", "tokenizer", "detokenizer", "all"]
MIN_SAMPLES = 300
"""Active samples a profile should hold (a share within +-6 points at 95%): a workload that
gives fewer is sent again, `MAX_REPEAT` times over at most, with fresh prompts."""
MAX_REPEAT = 16


class ServerProfileParams(BaseModel):
    patch_id: str | None = Field(None, description=PATCH_ID)
    knobs: dict[str, Any] | None = Field(None, description=KNOBS)
    processes: list[Process] = Field(
        ["scheduler", "tokenizer"],
        min_length=1,
        description="SGLang processes to attach to: scheduler (batching, the model's forward), "
        "tokenizer (HTTP front end and tokenization), detokenizer, or all.",
    )
    num_prompts: int | None = Field(
        None, ge=1, le=512, description="Requests to send (default: the experiment's workload)."
    )
    max_concurrency: int | None = Field(
        None, ge=1, le=512, description="At most this many in flight (default: the experiment's)."
    )
    gil_seconds: float = Field(
        4.0, ge=0.0, le=15.0, description="GIL trace window from the workload's start (0: none)."
    )


@instrument(
    "server_profile",
    "Run the experiment's workload (or a smaller one) on the task's server, patched or not, and "
    "profile the server's own processes meanwhile with py-spy: per process (scheduler, "
    "tokenizer, detokenizer) the hottest SGLang functions by self and by total time, and per "
    "thread its GIL states (holding, waiting for it, idle) with who held the GIL while it "
    "waited. Shows where the server spends its time, down to the function to patch, before a "
    f"patch and after it. {LOOK}",
    ServerProfileParams,
    needs="serving",
)
def server_profile(p: ServerProfileParams, ctx: ToolContext) -> ToolResult:
    from infra_agent.feedback.gil.pyspy import find_py_spy
    from infra_agent.serving.instruments.tracing import ROLES, profile_server

    if ctx.task.manifest.kind != "serving":
        raise UserError(f"task {ctx.task.name} is not a serving task (no server to profile)")
    find_py_spy()  # refused before a server starts: "py-spy not found (pip install py-spy)"
    roles: list[str] = list(ROLES) if "all" in p.processes else list(dict.fromkeys(p.processes))
    with task_server(
        ctx, p.patch_id, knobs=p.knobs, num_prompts=p.num_prompts, max_concurrency=p.max_concurrency
    ) as run:
        gil_s = p.gil_seconds or None
        report = profile_server(run.server, run.sessions, run.load, roles, label=run.label, gil_s=gil_s)  # fmt: skip
        busiest = max((process.samples for process in report.processes), default=0)
        if 0 < busiest < MIN_SAMPLES:  # too short a window: the workload again, longer
            repeat = min(MAX_REPEAT, math.ceil(1.3 * MIN_SAMPLES / busiest))
            n = len(run.sessions)
            sessions = run.harness.sessions(n * repeat, seed=2)
            load = run.load.model_copy(update={"max_concurrency": run.load.max_concurrency or n})
            label = f"{run.label}, sent {repeat}x over (fresh prompts, <= {n} in flight) for {MIN_SAMPLES}+ samples"  # fmt: skip
            report = profile_server(run.server, sessions, load, roles, label=label, gil_s=gil_s)
    return ToolResult(
        content=f"{report.render()}\n{run.look.render()}",
        data={**report.model_dump(mode="json"), "look": run.look.model_dump(mode="json")},
    )
