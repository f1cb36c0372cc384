"""What a patch breaks in Python that an experiment would only find by failing: pyflakes on each
changed module, before and after, and the problems the patch adds (a name it left undefined, a
syntax error). A warning in the answer that registers the patch, not a refusal: edit_file's edits
accumulate, and a step of a several-edit change may be incomplete on purpose."""

from __future__ import annotations

import re
from collections import Counter

from pyflakes.api import check
from pyflakes.messages import Message

SHOWN = 5
"""Problems listed at most; the rest are counted."""
SERIOUS = ("UndefinedName", "UndefinedLocal", "UndefinedExport", "SyntaxError")
"""pyflakes' findings that fail at run time (an unused import or variable does not)."""


class _Collect:
    """A pyflakes reporter that keeps what it is told."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []

    def unexpectedError(self, filename: str, msg: str) -> None:  # noqa: N802 - pyflakes' names
        self.found.append((0, f"cannot be read ({msg})"))

    def syntaxError(  # noqa: N802
        self, filename: str, msg: str, lineno: int | None, offset: int | None, text: str | None
    ) -> None:
        self.found.append((lineno or 0, f"syntax error: {msg}"))

    def flake(self, message: Message) -> None:
        if type(message).__name__ in SERIOUS:
            self.found.append((message.lineno, message.message % message.message_args))


def _problems(path: str, text: str) -> list[tuple[int, str]]:
    reporter = _Collect()
    check(text, path, reporter)  # type: ignore[arg-type]
    return reporter.found


def new_problems(files: dict[str, tuple[str | None, str | None]]) -> list[str]:
    """'path:line: problem' for each serious problem a changed Python module has after the patch
    and did not have before (by its words, wherever its line), `files`: path -> (before, after)."""
    out: list[str] = []
    for path, (before, after) in sorted(files.items()):
        if not path.endswith(".py") or after is None:
            continue
        had = (
            Counter(_key(m) for _, m in _problems(path, before))
            if before is not None
            else Counter()
        )
        for line, message in _problems(path, after):
            if had[_key(message)] > 0:
                had[_key(message)] -= 1
                continue
            out.append(f"{path}:{line}: {message}")
    return out


def _key(message: str) -> str:
    return re.sub(r"line \d+", "line N", message)


def render(problems: list[str]) -> str:
    """The warning line(s) for the patch's answer, '' when there is none."""
    if not problems:
        return ""
    more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
    shown = "; ".join(problems[:SHOWN])
    return f"warning: the patched code would fail when run: {shown}{more}"
