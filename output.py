"""The two faces of every CLI result: one JSON document on stdout (`--json`) or a rich rendering.

Commands build a typed record and call `emit(record, render)`. With `--json` exactly one JSON
document goes to stdout and nothing else does; progress and logs go to stderr.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel
from rich.console import Console

LOG_WIDTH = 160
"""Columns of output written to a file or a pipe (a run's log under nohup): rich's 80 broke an
eval report's table into one character a line. A terminal keeps its own width, and COLUMNS
still rules where it is set."""


def _console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    logged = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, width=LOG_WIDTH if logged else None)


# Human output and progress go to stderr when --json is on, so stdout stays machine-readable.
console = _console()
err_console = _console(stderr=True)


def to_jsonable(value: Any) -> Any:
    """Turn pydantic models (or lists/dicts of them) into plain JSON values."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    return value


def emit(value: Any, render: Callable[[Console], None], *, as_json: bool) -> None:
    """Print `value` as one JSON document, or call `render` to show it to a person."""
    if as_json:
        sys.stdout.write(json.dumps(to_jsonable(value), indent=2, sort_keys=False) + "\n")
        sys.stdout.flush()
    else:
        render(console)


def status_console(as_json: bool) -> Console:
    """Where progress goes: stderr when stdout is reserved for JSON."""
    return err_console if as_json else console
