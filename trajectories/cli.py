"""`infra-agent export`: runs as training datasets."""

from __future__ import annotations

import typer

from infra_agent.errors import NotBuiltError


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        format: str = typer.Option("atif", "--format", help="openai-sft | rl | atif"),
    ) -> None:
        """Export recorded runs as training data (OpenAI SFT JSONL, RL rows, ATIF records)."""
        raise NotBuiltError("infra-agent export (issue 9)")
