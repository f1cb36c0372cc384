"""Read and search the task's workspace (the code under optimization), read-only.

Paths are relative to the workspace; anything that resolves outside it (the harness, the
reference patch, the rest of the machine) is refused.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.context import ToolContext

MAX_FILES = 200


def _resolve(ctx: ToolContext, relative: str) -> Path:
    root = ctx.task.workspace.resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise UserError(f"'{relative}' is outside the task workspace")
    return path


def _files(ctx: ToolContext, pattern: str) -> list[str]:
    root = ctx.task.workspace.resolve()
    names = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(root).as_posix()
            if fnmatch.fnmatch(rel, pattern):
                names.append(rel)
    return names


class ListFiles(BaseModel):
    pattern: str = Field("*", description="Glob over workspace-relative paths, e.g. '*.py'.")


@tool(
    "list_files", "List files in the task workspace (the code you may read and patch).", ListFiles
)
def list_files(p: ListFiles, ctx: ToolContext) -> ToolResult:
    names = _files(ctx, p.pattern)
    editable = ctx.task.manifest.editable
    lines = [
        f"{n}{'  (editable)' if any(fnmatch.fnmatch(n, g) for g in editable) else ''}"
        for n in names[:MAX_FILES]
    ]
    more = f"\n[{len(names) - MAX_FILES} more]" if len(names) > MAX_FILES else ""
    return ToolResult(content="\n".join(lines) + more or "no files match", data={"files": names})


class ReadFile(BaseModel):
    path: str = Field(description="Workspace-relative path, e.g. 'kernel.py'.")
    start_line: int = Field(1, ge=1, description="First line to show (1-based).")
    max_lines: int = Field(200, ge=1, le=1000, description="How many lines to show at most.")


@tool("read_file", "Read lines of a workspace file, numbered.", ReadFile)
def read_file(p: ReadFile, ctx: ToolContext) -> ToolResult:
    path = _resolve(ctx, p.path)
    if not path.is_file():
        raise UserError(f"no file '{p.path}' in the workspace (see list_files)")
    lines = path.read_text(errors="replace").splitlines()
    chunk = lines[p.start_line - 1 : p.start_line - 1 + p.max_lines]
    body = "\n".join(f"{p.start_line + i:5d}  {line}" for i, line in enumerate(chunk))
    end = p.start_line - 1 + len(chunk)
    head = f"{p.path}: lines {p.start_line}-{end} of {len(lines)}"
    return ToolResult(content=f"{head}\n{body}")


class SearchFiles(BaseModel):
    regex: str = Field(description="Python regular expression searched line by line.")
    pattern: str = Field("*", description="Glob restricting which files are searched.")
    max_hits: int = Field(50, ge=1, le=500)


@tool("search_files", "Search workspace files for a regular expression.", SearchFiles)
def search_files(p: SearchFiles, ctx: ToolContext) -> ToolResult:
    try:
        rx = re.compile(p.regex)
    except re.error as exc:
        raise UserError(f"regex '{p.regex}' is invalid ({exc})") from exc
    hits: list[str] = []
    for name in _files(ctx, p.pattern):
        text = (ctx.task.workspace / name).read_text(errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if rx.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:160]}")
                if len(hits) >= p.max_hits:
                    return ToolResult(content="\n".join(hits) + "\n[max_hits reached]")
    return ToolResult(content="\n".join(hits) if hits else f"no line matches /{p.regex}/")
