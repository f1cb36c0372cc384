"""`infra-agent tools list`: the tools a run offers its model, as the model sees them."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from infra_agent.output import emit

tools_app = typer.Typer(help="The agent's tools: what a run on a task offers its model.")


@tools_app.command("list")
def list_command(
    task_name: str | None = typer.Option(
        None, "--task", help="Only the tools a run on this task offers (default: every tool)."
    ),
    feedback: str = typer.Option(
        "dense", "--feedback", help="'dense' (every tool) or 'sparse' (no instruments)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the OpenAI tools array the model is sent."
    ),
) -> None:
    """List the tools a run offers: name, what it needs and the first sentence of its
    description, or with --json exactly the schemas the model sees."""
    from infra_agent.errors import UserError
    from infra_agent.tasks.registry import find_task
    from infra_agent.tools.registry import default_registry

    if feedback not in ("dense", "sparse"):
        raise UserError(f"--feedback must be 'dense' or 'sparse', got '{feedback}'")
    task = find_task(task_name) if task_name else None
    registry = default_registry(feedback, task)
    schemas = registry.schemas()

    def render(console: Console) -> None:
        where = f"task {task.name}" if task else "any task (--task narrows to one)"
        table = Table(title=f"{len(schemas)} tools offered for {where}")
        for column in ("name", "needs", "description"):
            table.add_column(column)
        for name in registry.names():
            found = registry.get(name)
            assert found is not None
            first = found.description.split("\n")[0].split(". ")[0].rstrip(".")
            table.add_row(name, found.needs or "-", first)
        console.print(table)

    emit(schemas, render, as_json=as_json)


def register(app: typer.Typer) -> None:
    app.add_typer(tools_app, name="tools")
