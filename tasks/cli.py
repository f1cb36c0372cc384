"""`infra-agent tasks` and `infra-agent diagnose`."""

from __future__ import annotations

import typer

from infra_agent.errors import NotBuiltError

tasks_app = typer.Typer(help="List and show optimization tasks (bundled, search path, plugins).")


@tasks_app.command("list")
def list_tasks(as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
    """List the tasks infra-agent can optimize."""
    raise NotBuiltError("infra-agent tasks list (issue 3)")


def register(app: typer.Typer) -> None:
    from infra_agent.tasks.diagnose import register as register_diagnose

    app.add_typer(tasks_app, name="tasks")
    register_diagnose(app)
