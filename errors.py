"""Errors that reach a person: each carries a one-line message naming what is wrong.

The CLI prints `UserError` as `error: <message>` and exits non-zero without a traceback
(unless `--debug`). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input from a person or a file: a malformed config, an unknown task, a bad patch."""

    exit_code = 2


class StoreError(UserError):
    """The run store cannot be opened or used (unreadable file, newer schema)."""


def describe(error: BaseException, typed: bool = False) -> str:
    """One line for an exception, never empty: its message (after its type if `typed`), else its
    type and what caused it (an HTTP client's ReadError carries no message; a dropped connection
    is its cause)."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if text:
        return f"{type(error).__name__}: {text}" if typed else text
    cause = error.__cause__ or error.__context__
    why = f"; caused by {type(cause).__name__}: {describe(cause)}" if cause else ""
    return f"{type(error).__name__} (no message{why})"
