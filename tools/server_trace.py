"""`server_profile`: the profiler and the GIL tracer attached to the live server's processes.

A look (`tools.looks`): on the task's server with a patch (source, knobs or both; default the
baseline), kept for later looks at it as `serving_workload`'s is, it runs the experiment's
published workload against it (or fewer requests / in flight, when asked) and,
while it runs, attaches py-spy to the chosen SGLang processes (`serving.tracing`, the path the
serving diagnosis uses): per process, the hottest SGLang functions by self and by total time
with their shares of the active samples, and per thread its GIL states (holds / waits /
runs without it / idle) with who held the GIL while a thread waited. The typed
`serving.tracing.ServerProfile` is the data, with the look's record. A look is one sample, not a
verdict, and counts against the run's looks budget.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext
from infra_agent.tools.serving import KNOBS, LOOK, PATCH_ID, task_server

Process = Literal["scheduler", "tokenizer", "detokenizer", "all"]


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
    from infra_agent.serving.tracing import ROLES, profile_server

    if ctx.task.manifest.kind != "serving":
        raise UserError(f"task {ctx.task.name} is not a serving task (no server to profile)")
    find_py_spy()  # refused before a server starts: "py-spy not found (pip install py-spy)"
    roles: list[str] = list(ROLES) if "all" in p.processes else list(dict.fromkeys(p.processes))
    with task_server(
        ctx, p.patch_id, knobs=p.knobs, num_prompts=p.num_prompts, max_concurrency=p.max_concurrency
    ) as run:
        report = profile_server(
            run.server, run.sessions, run.load, roles, label=run.label, gil_s=p.gil_seconds or None
        )
    return ToolResult(
        content=f"{report.render()}\n{run.look.render()}",
        data={**report.model_dump(mode="json"), "look": run.look.model_dump(mode="json")},
    )
