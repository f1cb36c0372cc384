"""`infra-agent review list|show|approve|reject|serve`: the reviewer approval queue."""

from __future__ import annotations

import typer

from infra_agent.errors import NotBuiltError

app = typer.Typer(help="The reviewer approval queue: list, show, approve, reject, serve the web UI.")


@app.command("list")
def list_proposals(as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
    """List proposals waiting for review."""
    raise NotBuiltError("infra-agent review (issue 8)")
