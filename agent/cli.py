"""`infra-agent optimize`: the agent loop's command."""

from __future__ import annotations

import typer

from infra_agent.errors import NotBuiltError


def register(app: typer.Typer) -> None:
    @app.command()
    def optimize(
        target: str = typer.Option("throughput", "--target", help="throughput | latency | accuracy"),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Optimize a task: measure, propose patches, verify each by experiment, queue for review."""
        raise NotBuiltError("infra-agent optimize (the agent loop, issue 7)")
