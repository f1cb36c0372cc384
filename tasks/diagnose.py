"""`infra-agent diagnose --task T`: reproduce a task's symptom and localize it, changing no code."""

from __future__ import annotations

import typer

from infra_agent.errors import NotBuiltError


def register(app: typer.Typer) -> None:
    @app.command()
    def diagnose(
        task: str = typer.Option(..., "--task", help="Task name or folder."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Reproduce a task's symptom and localize it with the instruments, changing no code."""
        raise NotBuiltError("infra-agent diagnose (issue 5)")
