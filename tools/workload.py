"""The experiment's own workload for the tools: `task_workload(ctx, patch)` asks the task's
harness what `run_experiment` measures (tasks.workload), with the knobs that arm would run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infra_agent.tasks.workload import Workload
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.tasks.manifest import Task
    from infra_agent.tasks.patch import Patch


def task_workload(ctx: ToolContext, patch: Patch | None = None) -> Workload:
    """The workload the experiment measures for the baseline (no patch) or for `patch`'s arm
    (its knob assignment); the run's parameter overrides apply. Raises UserError when the
    harness cannot be loaded."""
    return workload_of(ctx.task, ctx.params, patch)


def workload_of(task: Task, params: dict[str, Any], patch: Patch | None = None) -> Workload:
    """`task_workload` for a task and a run's parameter overrides (no tool context needed)."""
    from infra_agent.experiments.arms import effective_params, load_harness
    from infra_agent.tasks.patch import effective_knobs

    harness = load_harness(task, effective_params(task.manifest, params))
    return harness.workload(effective_knobs(patch, task.manifest))
