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
    app.add_typer(tasks_app, name="tasks")

    @app.command()
    def diagnose(
        task: str = typer.Option(..., "--task", help="Task name or folder."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Reproduce a task's symptom and localize it with the instruments, changing no code."""
        raise NotBuiltError("infra-agent diagnose (issue 5)")
