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
