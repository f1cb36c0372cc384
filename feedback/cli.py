"""`infra-agent feedback accuracy|timeline|bench|gil`: the dense-feedback instruments."""

from __future__ import annotations

import typer

from infra_agent.errors import NotBuiltError

app = typer.Typer(help="Dense-feedback instruments: accuracy diff, timeline, microbenchmark, GIL.")


@app.command()
def bench(as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
    """Time baseline and candidate interleaved, with a confidence interval on the speedup."""
    raise NotBuiltError("infra-agent feedback bench (issue 4)")
