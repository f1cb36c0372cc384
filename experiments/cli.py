"""`infra-agent experiment`: run one experiment (baseline vs a patch) and record its verdict."""

from __future__ import annotations

import typer

from infra_agent.errors import NotBuiltError


def register(app: typer.Typer) -> None:
    @app.command()
    def experiment(
        task: str = typer.Option(..., "--task", help="Task name or folder."),
        patch: str = typer.Option(..., "--patch", help="Unified diff or knobs TOML."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Verify a patch against its task's baseline and print the verdict with its evidence."""
        raise NotBuiltError("infra-agent experiment (the verification core, issue 3)")
