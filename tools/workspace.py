"""Read and search the task's workspace (the code under optimization), read-only.

The workspace is the task's own folder, or for a serving task the whole installed SGLang package
(`tasks.tree`: paths like 'sglang/srt/managers/scheduler.py', the task's baseline as it runs).
Paths are relative to the workspace; anything outside it (the harness, the reference patch, the
rest of the machine) is refused.
"""

from __future__ import annotations

import re
from collections import Counter

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tasks.patch import glob_regex
from infra_agent.tasks.tree import WorkspaceTree, workspace_tree
from infra_agent.tools.base import MAX_RESULT_CHARS, ToolResult, tool
from infra_agent.tools.context import ToolContext

MAX_FILES = 200
MAX_SEARCHED_BYTES = 2_000_000
"""Files larger than this are not searched (data, not code)."""
READ_HEADER_CHARS = 200
"""Room read_file keeps for its first line within the registry's cap on a tool's answer."""
MAX_LINE_CHARS = 1000
"""One line longer than this (minified data) is cut, so a single line never fills the answer."""


def _files(tree: WorkspaceTree, pattern: str) -> list[str]:
    """Files matching a glob ('*' within a folder, '**' across folders); a pattern without '/'
    also matches file names anywhere ('*.py')."""
    rx = glob_regex(pattern)
    by_name = "/" not in pattern
    return [n for n in tree.files() if rx.match(n) or (by_name and rx.match(n.rsplit("/", 1)[-1]))]


def _folders(names: list[str]) -> list[str]:
    """A listing too long to show, as folders one level below the common prefix with counts."""
    split = [n.split("/") for n in names]
    depth = 0
    while all(len(p) > depth + 1 for p in split) and len({p[depth] for p in split}) == 1:
        depth += 1
    counts = Counter("/".join(p[: depth + 1]) + ("/" if len(p) > depth + 1 else "") for p in split)
    return [
        f"{name}  ({n} files)" if name.endswith("/") else name for name, n in sorted(counts.items())
    ]


class ListFiles(BaseModel):
    pattern: str = Field(
        "*",
        description="Glob over workspace paths: 'sglang/srt/managers/*.py', '**/sampler*.py', "
        "'*.py' (a pattern without '/' matches file names in any folder).",
    )


@tool(
    "list_files",
    "List files in the task workspace (the code you may read; '(editable)' marks what a patch "
    "may change). Long listings are summarized by folder: narrow the pattern to see files.",
    ListFiles,
)
def list_files(p: ListFiles, ctx: ToolContext) -> ToolResult:
    from infra_agent.tasks.patch import is_editable

    names = _files(workspace_tree(ctx.task), p.pattern)
    if not names:
        return ToolResult(content=f"no files match '{p.pattern}'", data={"files": []})
    if len(names) > MAX_FILES:
        folders = _folders(names)
        head = f"{len(names)} files match '{p.pattern}'; by folder:"
        return ToolResult(
            content="\n".join([head, *folders[:MAX_FILES]]), data={"files": names[:MAX_FILES]}
        )
    lines = [f"{n}{'  (editable)' if is_editable(n, ctx.task.manifest) else ''}" for n in names]
    return ToolResult(content="\n".join(lines), data={"files": names})


class ReadFile(BaseModel):
    path: str = Field(description="Workspace path, e.g. 'sglang/srt/layers/sampler.py'.")
    start_line: int = Field(1, ge=1, description="First line to show (1-based).")
    max_lines: int = Field(200, ge=1, le=1000, description="How many lines to show at most.")


@tool(
    "read_file",
    "Read lines of a workspace file, numbered. The first line of the answer says which lines it "
    "shows and where to continue (long lines fill the answer sooner than max_lines).",
    ReadFile,
)
def read_file(p: ReadFile, ctx: ToolContext) -> ToolResult:
    tree = workspace_tree(ctx.task)
    if not tree.inside(p.path):
        raise UserError(f"'{p.path}' is outside the task workspace")
    if not tree.is_file(p.path):
        raise UserError(f"no file '{p.path}' in the workspace (see list_files)")
    lines = tree.read_text(p.path).splitlines()
    if p.start_line > max(1, len(lines)):
        raise UserError(
            f"start_line {p.start_line} is past the end of {p.path} ({len(lines)} lines)"
        )
    budget = MAX_RESULT_CHARS - READ_HEADER_CHARS
    shown: list[str] = []
    for number in range(p.start_line, min(len(lines), p.start_line - 1 + p.max_lines) + 1):
        text = f"{number:5d}  {lines[number - 1]}"
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f" [... {len(text) - MAX_LINE_CHARS} more characters]"
        if shown and budget - len(text) - 1 < 0:
            break
        budget -= len(text) + 1
        shown.append(text)
    end = p.start_line - 1 + len(shown)
    head = f"{p.path}: lines {p.start_line}-{end} of {len(lines)}"
    if end < len(lines):
        head += f"; continue with start_line={end + 1}"
    return ToolResult(
        content=f"{head}\n" + "\n".join(shown),
        data={"path": p.path, "start_line": p.start_line, "end_line": end, "total": len(lines)},
    )


class SearchFiles(BaseModel):
    regex: str = Field(description="Python regular expression searched line by line.")
    pattern: str = Field(
        "*", description="Glob restricting which files are searched, e.g. 'sglang/srt/**/*.py'."
    )
    max_hits: int = Field(50, ge=1, le=500)


@tool("search_files", "Search workspace files for a regular expression.", SearchFiles)
def search_files(p: SearchFiles, ctx: ToolContext) -> ToolResult:
    try:
        rx = re.compile(p.regex)
    except re.error as exc:
        raise UserError(f"regex '{p.regex}' is invalid ({exc})") from exc
    tree = workspace_tree(ctx.task)
    hits: list[str] = []
    for name in _files(tree, p.pattern):
        data = tree.read_bytes(name)
        if len(data) > MAX_SEARCHED_BYTES or b"\0" in data[:8192]:
            continue  # binary or data
        for number, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
            if rx.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:160]}")
                if len(hits) >= p.max_hits:
                    return ToolResult(content="\n".join(hits) + "\n[max_hits reached]")
    return ToolResult(content="\n".join(hits) if hits else f"no line matches /{p.regex}/")
