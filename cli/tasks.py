"""`infra-agent tasks list|show|check`: the tasks infra-agent can optimize (`check` measures a
task's symptom and its reference and wrong fixes: `experiments/check.py`)."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from infra_agent.output import emit
from infra_agent.tasks.manifest import Task, TaskManifest

tasks_app = typer.Typer(help="List and show optimization tasks (bundled, search path, plugins).")


class TaskSummary(BaseModel):
    """One line of `tasks list`."""

    name: str
    title: str
    objective: str
    metric: str
    unit: str
    higher_is_better: bool
    kind: str
    knobs: list[str]
    folder: str

    @classmethod
    def of(cls, task: Task) -> TaskSummary:
        m = task.manifest
        return cls(
            name=m.name,
            title=m.title,
            objective=m.objective,
            metric=m.metric.name,
            unit=m.metric.unit,
            higher_is_better=m.metric.higher_is_better,
            kind=m.kind,
            knobs=sorted(m.knobs),
            folder=str(task.root),
        )

    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"


class TaskDetail(BaseModel):
    """`tasks show`: the manifest, where the task lives, and its README."""

    name: str
    folder: str
    manifest: TaskManifest
    readme: str
    has_reference_patch: bool


@tasks_app.command("list")
def list_command(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """List the tasks infra-agent can optimize."""
    from infra_agent.cli.context import current
    from infra_agent.tasks.registry import list_tasks

    summaries = [TaskSummary.of(t) for t in list_tasks(current().task_search_path())]

    def render(console: Console) -> None:
        table = Table(title=f"{len(summaries)} tasks")
        for column in ("name", "objective", "metric", "title"):
            table.add_column(column)
        for s in summaries:
            table.add_row(s.name, s.objective, f"{s.metric} ({s.unit}, {s.direction()})", s.title)
        console.print(table)

    emit(summaries, render, as_json=as_json)


@tasks_app.command("show")
def show_command(
    name: str = typer.Argument(..., help="Task name or folder."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Show a task's manifest and story."""
    from infra_agent.cli.context import current
    from infra_agent.tasks.registry import find_task

    task = find_task(name, current().task_search_path())
    readme_path = task.root / "README.md"
    detail = TaskDetail(
        name=task.name,
        folder=str(task.root),
        manifest=task.manifest,
        readme=readme_path.read_text() if readme_path.is_file() else "",
        has_reference_patch=task.reference_patch is not None,
    )

    def render(console: Console) -> None:
        m = task.manifest
        console.print(f"[bold]{m.name}[/bold] — {m.title}")
        console.print(m.story)
        direction = "higher is better" if m.metric.higher_is_better else "lower is better"
        console.print(
            f"objective: {m.objective}; metric: {m.metric.name} ({m.metric.unit}, {direction})"
        )
        console.print(f"editable: {', '.join(m.editable)}")
        for knob_name, knob in m.knobs.items():
            domain = knob.choices if knob.choices is not None else f"[{knob.min}, {knob.max}]"
            console.print(
                f"knob {knob_name}: {knob.type} default {knob.default!r} in {domain}  {knob.help}"
            )
        if m.params:
            console.print("params: " + ", ".join(f"{k}={v!r}" for k, v in m.params.items()))
        if m.plausible_speedup is not None:
            console.print(f"plausible speedup: up to {m.plausible_speedup:g}x")
        console.print(f"folder: {_short(task.root)}")

    emit(detail, render, as_json=as_json)


def _short(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@tasks_app.command("check")
def check_command(
    task: str = typer.Argument(..., help="Task name or folder."),
    param: list[str] = typer.Option([], "--param", help="Task parameter NAME=VALUE (repeat)."),
    sandbox: str | None = typer.Option(
        None, "--sandbox", help="Sandbox backend: local or docker (default: configured)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Measure a task's symptom, its reference fix and its wrong fix (exit 1 if any is off)."""
    from infra_agent.cli.context import current
    from infra_agent.cli.options import parse_params
    from infra_agent.experiments.check import check_task
    from infra_agent.output import emit, err_console
    from infra_agent.tasks.registry import find_task

    settings = current().settings()
    found = find_task(task, settings.tasks.search_path)
    with err_console.status(f"checking {found.name}") as status:
        result = check_task(
            found,
            params=parse_params(param),
            sandbox=sandbox or settings.sandbox.backend,
            store=current().store(),
            progress=lambda msg: status.update(f"checking {found.name}: {msg}"),
        )

    def render(console: Console) -> None:
        table = Table(title=f"tasks check {result.task} ({result.metric})")
        for column in ("question", "verdict", "want", "", "number", "time"):
            table.add_column(column)
        for row in result.rows:
            mark = {True: "ok", False: "FAIL", None: "n/a"}[row.ok]
            table.add_row(
                row.question, row.verdict or "-", row.expected, mark, row.number,
                f"{row.duration_s:.0f} s" if row.duration_s else "-",
            )  # fmt: skip
        console.print(table)
        console.print(
            f"{'OK' if result.passed else 'PROBLEM'}: {result.task} in {result.duration_s:.0f} s"
        )

    emit(result, render, as_json=as_json)
    if not result.passed:
        raise typer.Exit(1)
