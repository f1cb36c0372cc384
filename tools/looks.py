"""Looks: the serving instruments' runs on the task's server, patched or not, kept for the run.

A look (`serving_workload`, `server_steps`, `server_profile`) runs on the task's deployment with
a patch (a source patch, knobs, or both) started exactly as an experiment starts an arm's server
(`ServingHarness.prepare`: the overlay of a workspace copy with the task's injected fault and the
patch, the knobs as server arguments, confinement, a warm-up), so the model can look at a patch
before it spends an experiment on it, and again after a win. Every look server logs each
scheduler step (`serving.instruments.steps`: one log line per step, for `server_steps`), so one server per
patch serves all three instruments.

The servers are kept for the run, one per patch and knob set (the last `tools.kept_servers.KEPT_SERVERS`;
an older one is stopped), paused between looks (an idle SGLang scheduler polls without sleeping; paused it
takes no CPU from experiments), and stopped when the run ends (`ToolContext.close`). A second look at the same patch costs its workload, not a start.

A look is one run of the workload on one server: not a verdict (run_experiment repeats,
interleaves, checks accuracy and health), and its rendering says so. Looks count against a
budget of their own (`ToolContext.looks_limit`); a look past it is refused in one line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from infra_agent.errors import UserError

if TYPE_CHECKING:
    from infra_agent.experiments.arms import ArmSet
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.serving.server import Server
    from infra_agent.tasks.harness import Arm
    from infra_agent.tasks.patch import Patch
    from infra_agent.tools.context import ToolContext

LOOK_TOOLS = frozenset({"serving_workload", "server_steps", "server_profile"})
"""The instruments that look (their runs count against the run's looks budget)."""
NOT_A_VERDICT = "one run on one server, not a verdict: run_experiment judges a patch"


class Look(BaseModel):
    """What a look ran on: which patch, its server, and where it stands in the looks budget."""

    patch_id: str | None
    """The patch looked at (None: the task's baseline)."""
    patch: str
    """The patch in a few words: the files a diff touches, or its knobs."""
    knobs: dict[str, Any]
    """Knob values set on top of the patch for this look (the look's `knobs`)."""
    number: int
    """This look's number in the run (1 for the first)."""
    limit: int | None
    """The run's looks budget (None: no limit)."""
    reused: bool
    """True when the server was started by an earlier look at the same patch and knobs."""
    start_s: float
    """Seconds the server took to start and warm up (by this look or the earlier one)."""
    started_as: list[str] = Field(default_factory=list)
    """What the server's start-up log said it chose (`serving.instruments.startup`)."""

    def render(self) -> str:
        of = f"/{self.limit}" if self.limit is not None else ""
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.knobs.items()))
        what = self.patch + (f" + knobs {extra}" if extra else "")
        server = (
            f"server reused (started {self.start_s:.0f} s for an earlier look at it)"
            if self.reused
            else f"server started {self.start_s:.0f} s, kept for later looks at it"
        )
        said = (
            f"the server as it started: {'; '.join(self.started_as)}\n" if self.started_as else ""
        )
        return f"{said}look {self.number}{of} at {what} ({NOT_A_VERDICT}); {server}"


def describe_patch(patch_id: str | None, patch: Patch | None) -> str:
    """The patch in a few words: 'baseline', or its id with the files or knobs it changes."""
    if patch is None or patch_id is None:
        return "baseline"
    if patch.kind == "diff":
        return f"patch {patch_id[:12]} (diff: {', '.join(patch.files) or '?'})"
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(patch.knobs.items()))
    return f"patch {patch_id[:12]} (knobs {knobs})"


@dataclass
class LookServer:
    """One look server: the harness and arm that started it (`ServingHarness.prepare`)."""

    harness: ServingHarness
    arm: Arm
    arms: ArmSet
    """The arm's sandbox (its workspace copy), released by `close`."""
    start_s: float
    started_as: list[str] = field(default_factory=list)
    """What its start-up log said it chose (attention backend, KV cache, prefix cache class)."""

    @contextmanager
    def running(self) -> Iterator[Server]:
        """The server, resumed for a look and paused again after it."""
        try:
            yield self.harness.server(self.arm)  # resumed; ServerFailed when it died
        finally:
            self.harness.activate(None)

    def alive(self) -> bool:
        server: Server | None = self.arm.state.get("server")
        return server is not None and server.alive()

    def close(self) -> None:
        try:
            self.harness.finish(self.arm)
        finally:
            self.arms.close()


def start_look_server(ctx: ToolContext, patch: Patch | None, knobs: dict[str, Any]) -> LookServer:
    """The task's server with `patch` (its workspace copy and knobs) and `knobs` as server
    arguments, logging every scheduler step, started as an experiment's arm is."""
    from infra_agent.experiments.arms import arm_set
    from infra_agent.serving.instruments.startup import startup_facts
    from infra_agent.serving.instruments.steps import STEP_KNOBS, instrumented
    from infra_agent.serving.server import ServerFailed
    from infra_agent.tools.sandboxed import open_sandbox
    from infra_agent.tools.workload import task_harness

    harness = task_harness(ctx)
    harness.deployment = instrumented(harness.deployment)
    arms = arm_set(ctx.task)
    try:
        box = open_sandbox(ctx, patch)
        name = "baseline" if patch is None else "candidate"
        arm = arms.open(name, box, {**knobs, **STEP_KNOBS}, harness.params)
        started = time.monotonic()
        try:
            harness.prepare(arm)
        except BaseException:
            harness.finish(arm)
            raise
    except ServerFailed as exc:
        arms.close()
        tail = "\n".join(exc.log_tail.strip().splitlines()[-8:])
        raise UserError(
            f"the server did not start with this patch: {exc}" + (f"\n{tail}" if tail else "")
        ) from exc
    except BaseException:
        arms.close()
        raise
    server: Server = arm.state["server"]
    try:
        facts = startup_facts(server.log_path.read_text(errors="replace"))
    except OSError:
        facts = []
    return LookServer(harness, arm, arms, time.monotonic() - started, facts)


def look_key(patch: Patch | None, knobs: dict[str, Any]) -> str:
    """The key a look server is kept under: the patch and the knobs it was started with."""
    return json.dumps([patch.hash if patch else None, knobs], sort_keys=True, default=str)


def take_look(
    ctx: ToolContext, patch_id: str | None, knobs: dict[str, Any] | None
) -> tuple[Patch | None, dict[str, Any], int]:
    """Check the looks budget and count this look; return (patch, the look's effective knobs,
    look number). Refused in one line when the budget is spent."""
    from infra_agent.tasks.patch import Patch, effective_knobs

    patch = ctx.patch(patch_id) if patch_id else None
    effective = effective_knobs(patch, ctx.task.manifest)
    if knobs:  # validated as a knob patch would be
        extra = effective_knobs(Patch(kind="knobs", knobs=knobs), ctx.task.manifest)
        effective.update({k: extra[k] for k in knobs})
    if ctx.looks_limit is not None and ctx.looks_used >= ctx.looks_limit:
        raise UserError(
            f"looks budget spent ({ctx.looks_used}/{ctx.looks_limit}): serving_workload, "
            "server_steps and server_profile run no more in this run; run_experiment still judges"
        )
    ctx.looks_used += 1
    return patch, effective, ctx.looks_used
