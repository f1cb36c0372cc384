"""The experiment's own workload for the tools: `task_workload(ctx, patch)` asks the task's
harness what `run_experiment` measures (tasks.workload), with the knobs that arm would run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infra_agent.errors import UserError
from infra_agent.tasks.workload import Workload
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.tasks.harness import Harness
    from infra_agent.tasks.manifest import Task
    from infra_agent.tasks.patch import Patch


def task_workload(ctx: ToolContext, patch: Patch | None = None) -> Workload:
    """The workload the experiment measures for the baseline (no patch) or for `patch`'s arm
    (its knob assignment); the run's parameter overrides apply. Raises UserError when the
    harness cannot be loaded."""
    return workload_of(ctx.task, ctx.params, patch)


def workload_of(task: Task, params: dict[str, Any], patch: Patch | None = None) -> Workload:
    """`task_workload` for a task and a run's parameter overrides (no tool context needed)."""
    from infra_agent.tasks.patch import effective_knobs

    return harness_of(task, params).workload(effective_knobs(patch, task.manifest))


def harness_of(task: Task, params: dict[str, Any]) -> Harness:
    """The task's harness as an experiment builds it, with the run's parameter overrides."""
    from infra_agent.experiments.arms import effective_params, load_harness

    return load_harness(task, effective_params(task.manifest, params))


def task_harness(ctx: ToolContext, **overrides: Any) -> ServingHarness:
    """The task's serving harness with the run's parameters and the call's workload overrides
    (None: the task's own value) on top: its `load` and `sessions` are what the tools send."""
    from infra_agent.serving.harness import ServingHarness

    harness = harness_of(ctx.task, ctx.params)
    if not isinstance(harness, ServingHarness):
        raise UserError(f"task {ctx.task.name} is not a serving task (no server to start)")
    harness.params.update({k: v for k, v in overrides.items() if v is not None})
    return harness
