"""Why a unified diff does not apply: the failing hunk's expected lines next to the file's lines.

`git apply` says only `patch failed: dispatch.py:11`. `explain_mismatch(diff, root)` finds the
first hunk whose old side (context and '-' lines) occurs nowhere in its file, and shows those
lines next to what the file has where the hunk fits best (bounded), marking lines that differ.

    why = explain_mismatch(patch.diff, workspace_root)   # '' when every hunk's lines are there
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")
SHOWN_LINES = 12
"""At most this many lines of each side are shown."""
LINE_CHARS = 120


@dataclass
class Hunk:
    path: str
    header: str
    start: int
    """The old-side line number the header names (1-based)."""
    old: list[str] = field(default_factory=list)
    """Context and removed lines, without their prefix."""


def _path(raw: str) -> str:
    name = raw.split("\t")[0].strip()
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse_hunks(diff: str) -> list[Hunk]:
    """Every hunk of `diff`, with the file it changes (its old path)."""
    hunks: list[Hunk] = []
    path = ""
    lines = diff.splitlines()
    current: Hunk | None = None
    for i, line in enumerate(lines):
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            path, current = _path(line[4:]), None
            if path == "/dev/null":
                path = _path(lines[i + 1][4:])
        elif line.startswith("diff "):
            current = None
        elif match := _HUNK.match(line):
            current = Hunk(path=path, header=line.split("@@")[1].strip(), start=int(match[1]))
            hunks.append(current)
        elif current is not None and (line.startswith((" ", "-")) or line == ""):
            current.old.append(line[1:])
    return hunks


def _occurs(block: list[str], lines: list[str]) -> bool:
    n = len(block)
    return any(lines[i : i + n] == block for i in range(len(lines) - n + 1))


def _best_place(block: list[str], lines: list[str], stated: int) -> int:
    """0-based start where most of `block`'s lines match (ignoring surrounding whitespace),
    nearest the stated start on ties; the stated start when nothing matches."""
    want = [b.strip() for b in block]
    have = [h.strip() for h in lines]
    best, best_key = max(0, min(stated - 1, len(lines) - 1)), (0, 0)
    for start in range(max(1, len(lines) - len(block) + 1)):
        score = sum(1 for i, w in enumerate(want) if start + i < len(have) and have[start + i] == w)
        key = (score, -abs(start - (stated - 1)))
        if score and key > best_key:
            best, best_key = start, key
    return best


def _cut(text: str) -> str:
    return text if len(text) <= LINE_CHARS else text[: LINE_CHARS - 3] + "..."


def explain_mismatch(diff: str, root: Path) -> str:
    """The first hunk of `diff` whose old lines are not in its file under `root`, shown next
    to the file's lines where it fits best; '' when every hunk's lines occur in its file."""
    hunks = parse_hunks(diff)
    failing = []
    for hunk in hunks:
        file = root / hunk.path
        if not hunk.old or not hunk.path or not file.is_file():
            continue
        lines = file.read_text(errors="replace").split("\n")
        if not _occurs(hunk.old, lines):
            failing.append((hunk, lines))
    if not failing:
        return ""
    hunk, lines = failing[0]
    place = _best_place(hunk.old, lines, hunk.start)
    actual = lines[place : place + len(hunk.old)]
    differ = [i for i, want in enumerate(hunk.old) if i >= len(actual) or actual[i] != want]
    first = max(0, differ[0] - 3) if differ else 0
    shown = range(first, min(len(hunk.old), first + SHOWN_LINES))
    index = hunks.index(hunk) + 1
    out = [
        f"hunk {index} of {len(hunks)} ({hunk.path} @@ {hunk.header} @@) does not match the "
        f"workspace ({len(failing)} hunk(s) do not); '!' marks lines that differ:",
        f"your diff expects (context and '-' lines, from line {hunk.start}):",
    ]
    out += [f"{'!' if i in differ else ' '} {_cut(hunk.old[i])}" for i in shown]
    out.append(f"{hunk.path} has at lines {place + first + 1}-{place + shown[-1] + 1}:")
    for i in shown:
        if i >= len(actual):
            out.append("! (end of file)")
            break
        out.append(f"{'!' if i in differ else ' '} {place + i + 1:5d}  {_cut(actual[i])}")
    whitespace = [i for i in differ if i < len(actual) and actual[i].strip() == hunk.old[i].strip()]
    if whitespace:
        out.append(f"{len(whitespace)} of the differing lines differ only in whitespace")
    out.append("copy context lines exactly from read_file, or use edit_file(path, old, new)")
    return "\n".join(out)
