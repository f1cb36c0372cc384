"""Describe the task, and turn the model's diffs and knob assignments into checked patches.

A proposed patch is applied to a scratch copy of the workspace at once, so a diff that does not
apply, touches a file the task does not allow, or sets an unknown knob is refused here with the
reason, before an experiment is spent on it. Accepted patches go to the run store by content hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, model_validator

from infra_agent.tasks.manifest import Task, TaskManifest
from infra_agent.tools import lint
from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.tasks.patch import Patch


def describe_knobs(manifest: TaskManifest) -> list[str]:
    lines = []
    for name, knob in manifest.knobs.items():
        domain = (
            f"one of {knob.choices}"
            if knob.choices is not None
            else f"{knob.type} in [{knob.min}, {knob.max}]"
            if knob.min is not None or knob.max is not None
            else knob.type
        )
        gpu = " (needs GPU)" if knob.needs_gpu else ""
        lines.append(f"- {name}: {domain}, default {knob.default!r}{gpu}. {knob.help}".rstrip())
    return lines


class DescribeTask(BaseModel):
    pass


@tool(
    "describe_task",
    "The task again as the first message gave it: story, objective, metric, success criteria, "
    "editable files, knobs, the measured workload and, for a serving task, the deployment "
    "(launch command, device, dtype, attention backend, model config).",
    DescribeTask,
)
def describe_task(p: DescribeTask, ctx: ToolContext) -> ToolResult:
    return ToolResult(content=task_overview(ctx.task, ctx.params))


def task_overview(task: Task, params: dict[str, Any]) -> str:
    """The task, what run_experiment measures and, for a serving task, how its server starts:
    what describe_task returns and the first message starts with."""
    parts = [task_description(task.manifest), published_workload(task, params)]
    return "\n".join([*(p for p in parts if p), published_deployment(task, params)]).rstrip()


def task_description(m: TaskManifest) -> str:
    """The task in words (the head of `task_overview`)."""
    from infra_agent.experiments.criteria import success_criteria

    direction = "higher is better" if m.metric.higher_is_better else "lower is better"
    lines = [
        f"task {m.name} ({m.kind}): {m.title}".rstrip(": "),
        f"objective: {m.objective}; metric {m.metric.name} [{m.metric.unit}], {direction}",
        f"story: {m.story.strip()}",
        "success criteria:",
        *(f"- {line}" for line in success_criteria(m)),
        f"editable files (globs in workspace/): {', '.join(m.editable) or 'none'}",
    ]
    if m.knobs:
        lines.append("knobs:")
        lines.extend(describe_knobs(m))
    if m.plausible_speedup:
        from infra_agent.experiments.measure import gain_name

        lines.append(f"{gain_name(m)}s above {m.plausible_speedup:g}x are flagged suspicious")
    if m.invariants:
        lines.append("invariants checked on every correctness pass (breaking one is INCORRECT):")
        lines.extend(f"- {name}: {what}" for name, what in m.invariants.items())
    return "\n".join(lines)


def published_workload(task: Task, params: dict[str, Any]) -> str:
    """What run_experiment measures, in a few lines (tools.workload), or '' when the harness
    cannot say."""
    from infra_agent.errors import UserError
    from infra_agent.tools.workload import workload_of

    try:
        return workload_of(task, params).render()
    except UserError:
        return ""


def published_deployment(task: Task, params: dict[str, Any]) -> str:
    """How a serving task's server starts (tools.deployment), or '' for a task without a server
    or whose deployment cannot be read."""
    from infra_agent.errors import UserError
    from infra_agent.tools.deployment import deployment_view

    try:
        view = deployment_view(task, params)
    except UserError as exc:
        return f"deployment: not available ({exc})"
    return view.render() if view is not None else ""


def check_and_store(patch: Patch, ctx: ToolContext) -> ToolResult:
    """Check a proposed patch on a scratch copy (once: the check is kept for its experiment),
    store it, and answer with its patch_id (the
    one path every patch the model proposes goes through: propose_patch, propose_knobs,
    edit_file)."""
    from infra_agent.tasks.checked import check_patch

    checked = check_patch(patch, ctx.task).accepted()  # raises with the reason
    knobs = checked.knobs
    ctx.store.put_patch(patch.to_record())
    ctx.checked[patch.hash] = checked  # run_experiment reuses the check
    if patch.hash in ctx.known_patches:  # most recent last: edit_file builds on the latest
        ctx.known_patches.remove(patch.hash)
    ctx.known_patches.append(patch.hash)
    changed = ", ".join(patch.files) if patch.files else "no files"
    knob_text = ", ".join(f"{k}={v!r}" for k, v in sorted(knobs.items())) or "task defaults"
    texts = {f.path: (_decoded(f.before), _decoded(f.after)) for f in checked.files}
    warning = lint.render(lint.new_problems(texts))
    return ToolResult(
        content=(
            f"patch_id: {patch.hash}\napplies cleanly; changes {changed}; effective knobs: "
            f"{knob_text}\n{warning + chr(10) if warning else ''}"
            "next: run_experiment(patch_id) to verify it against baseline (its first 12 "
            "characters are enough)"
        ),
        data={"patch_id": patch.hash, "files": list(patch.files), "knobs": knobs},
    )


def _decoded(content: bytes | None) -> str | None:
    return None if content is None else content.decode(errors="replace")


class ProposePatch(BaseModel):
    diff: str = Field(
        description="A unified diff against the workspace (paths like a/kernel.py b/kernel.py)."
    )
    rationale: str = Field(description="The hypothesis: why this should improve the metric.")


@tool(
    "propose_patch",
    "Check a unified diff against the workspace and register it; returns its patch_id.",
    ProposePatch,
    needs="code",
)
def propose_patch(p: ProposePatch, ctx: ToolContext) -> ToolResult:
    from infra_agent.tasks.patch import parse_diff

    return check_and_store(parse_diff(p.diff, author=ctx.author, rationale=p.rationale), ctx)


class ProposeKnobs(BaseModel):
    knobs: dict[str, Any] = Field(
        description='Knob name -> value, e.g. {"chunked_prefill_size": 512} (see describe_task).'
    )
    rationale: str = Field(description="The hypothesis: why these values should help.")


@tool(
    "propose_knobs",
    "Check a knob assignment against the task's knob space and register it; returns its patch_id.",
    ProposeKnobs,
    needs="knobs",
)
def propose_knobs(p: ProposeKnobs, ctx: ToolContext) -> ToolResult:
    from infra_agent.tasks.patch import knob_patch

    return check_and_store(knob_patch(p.knobs, author=ctx.author, rationale=p.rationale), ctx)


class RunExperiment(BaseModel):
    patch_id: str = Field(
        "", description="A patch_id, as proposing or editing a patch returned it."
    )
    extend: str | None = Field(
        None,
        description="Instead of patch_id: the id of an experiment that ended NO_CHANGE flagged "
        "underpowered or unresolved (its answer says 'extendable'), to continue it with more "
        "pairs on the same patch.",
    )

    @model_validator(mode="after")
    def _one_of(self) -> RunExperiment:
        if bool(self.patch_id) == bool(self.extend):
            raise ValueError("give either patch_id (a new experiment) or extend (an experiment id)")
        return self


@tool(
    "run_experiment",
    "Verify a patch against baseline: correctness, then interleaved timing with a 95% CI, then "
    "health. Returns the verdict (IMPROVED / NO_CHANGE / REGRESSED / INCORRECT / FAILED / "
    "REJECTED) and the numbers. Costs one experiment from the budget. With extend=<experiment "
    "id> instead, continues an unresolved NO_CHANGE with more pairs on the same patch.",
    RunExperiment,
    deferred=True,
)
def run_experiment(p: RunExperiment, ctx: ToolContext) -> ToolResult:  # pragma: no cover
    raise AssertionError("run_experiment is executed by the graph's experiment node")


class Finish(BaseModel):
    summary: str = Field(description="What you found and which patch_id is best, in a few lines.")


@tool(
    "finish",
    "Stop optimizing. The best IMPROVED patch goes to the review queue.",
    Finish,
    deferred=True,
)
def finish(p: Finish, ctx: ToolContext) -> ToolResult:  # pragma: no cover
    raise AssertionError("finish is handled by the graph")
