"""Python run from a string: `python -c CODE` in a command the candidate's code writes down.

A command is an argument list (`[sys.executable, "-c", code]`, `os.execl(python, python, "-c",
code)`) or a shell command string (`os.system("python3 -c 'import os; ...'")`), also a shell's own
`-c` string inside either (`["sh", "-c", "python -c ..."]`). The static rules (experiments/rules.py)
count each one as starting a process and read CODE, when it is a constant, like any other code.
Nothing here imports or runs anything.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence

PYTHON = "python"
"""The word an interpreter expression (`sys.executable`) stands for in a command."""
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?[mw]?$")
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})
_WRAPPERS = frozenset({"env", "exec", "nohup", "setsid", "sudo", "command", "time", "nice",
                       "timeout", "taskset", "stdbuf", "chrt", "ionice", "xargs"})  # fmt: skip
"""Programs that run the command after them (their options, numbers and A=1 skipped too)."""
_MAX_DEPTH = 4
"""Shells within shells read before giving up (a real command nests one or two)."""

Word = str | None
"""One word of a command: its text, or None where it is computed at run time."""


def _program(word: Word) -> str | None:
    """'python' or 'sh' (etc.) when `word` names that program (any directory, any version)."""
    if word is None:
        return None
    name = os.path.basename(word)
    if _PYTHON.match(name):
        return PYTHON
    return name if name in _SHELLS else None


def _option(word: Word) -> bool:
    """An option before -c (`python -u -I -c`); `-cCODE` is -c itself."""
    return word is not None and word.startswith("-") and not word.startswith("-c")


def _dash_c(words: Sequence[Word], at: int) -> tuple[str, Word] | None:
    """(program, CODE) when `words[at]` runs `python|sh [options] -c CODE`."""
    program = _program(words[at])
    if program is None:
        return None
    j = at + 1
    while j < len(words) and _option(words[j]):
        j += 1
    flag = words[j] if j < len(words) else None
    if flag is None or not flag.startswith("-c"):
        return None
    return program, flag[2:] or (words[j + 1] if j + 1 < len(words) else None)


def inline_code(words: Sequence[Word]) -> list[Word]:
    """The CODE of every `python [options] -c CODE` in an argument list (None: computed at run
    time). A shell's `-c` string is a string: `command_code` reads it."""
    runs = (_dash_c(words, i) for i in range(len(words)))  # execl: path, then argv[0]
    return [run[1] for run in runs if run is not None and run[0] == PYTHON]


def _commands(text: str) -> list[list[Word]]:
    """A shell command string's simple commands (split at ; & | && || and parentheses), each from
    its program on: wrappers (`env A=1`, `timeout 5`, `nohup`) and assignments dropped. Prose
    (`use python -c to test`) has no command starting at `python`. NUL: a run-time part."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    commands: list[list[Word]] = [[]]
    for token in lexer:
        word: Word = None if "\0" in token else token
        current = commands[-1]
        if token and all(c in ";&|()" for c in token):
            commands.append([])
        elif current or not (
            word is None
            or word in _WRAPPERS
            or "=" in word
            or word.startswith("-")
            or word.isdigit()
        ):
            current.append(word)
    return [c for c in commands if c]


def command_code(text: str, depth: int = 0) -> list[Word]:
    """The CODE of every `python -c CODE` a shell command string runs, also inside a shell's own
    `-c` string in it; nothing when `text` is not such a command (no `-c`, or words a shell could
    not split)."""
    if "-c" not in text:
        return []
    try:
        commands = _commands(text)
    except ValueError:  # unbalanced quotes: not a command
        return []
    found: list[Word] = []
    for run in (_dash_c(words, 0) for words in commands):
        if run is not None and run[0] == PYTHON:
            found.append(run[1])
        elif run is not None and run[1] is not None and depth < _MAX_DEPTH:
            found += command_code(run[1], depth + 1)
    return found
