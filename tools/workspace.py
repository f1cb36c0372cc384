"""Read and search the task's workspace (the code under optimization), read-only.

The workspace is the task's own folder, or for a serving task the whole installed SGLang package
(`tasks.tree`: paths like 'sglang/srt/managers/scheduler.py', the task's baseline as it runs).
Paths are relative to the workspace; anything outside it (the harness, the reference patch, the
rest of the machine) is refused.
"""

from __future__ import annotations

import ast
import re
from collections import Counter

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tasks.patch import glob_regex
from infra_agent.tasks.tree import WorkspaceTree, workspace_tree
from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.context import ToolContext

MAX_FILES = 200
MAX_SEARCHED_BYTES = 2_000_000
"""Files larger than this are not searched (data, not code)."""
READ_CHARS = 16_000
"""read_file's answer at most this long (about 4k tokens): SGLang's 350-450-line modules hold
14-25k characters with line numbers, so a 400-line module takes two answers at most."""
READ_HEADER_CHARS = 200
"""Room read_file keeps for its first line within `READ_CHARS`."""
SEARCH_CHARS = 5600
"""search_files' answer holds whole hits up to this many characters (under the registry's cut),
then says which `skip` goes on: a cut in mid-hit had left a model no way to continue."""
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
    max_lines: int = Field(
        200,
        ge=1,
        le=1000,
        description=f"How many lines to show at most (one answer holds at most {READ_CHARS:,} "
        "characters: a 400-line module takes two answers at most).",
    )


@tool(
    "read_file",
    f"Read lines of a workspace file, numbered: the lines asked for, up to {READ_CHARS:,} "
    "characters per answer. The first line of the answer says which lines it shows and where "
    "to continue.",
    ReadFile,
    max_chars=READ_CHARS,
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
    budget = READ_CHARS - READ_HEADER_CHARS
    last = min(len(lines), p.start_line - 1 + p.max_lines)
    shown: list[str] = []
    for number in range(p.start_line, last + 1):
        text = f"{number:5d}  {lines[number - 1]}"
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f" [... {len(text) - MAX_LINE_CHARS} more characters]"
        if shown and budget - len(text) - 1 < 0:
            break
        budget -= len(text) + 1
        shown.append(text)
    end = p.start_line - 1 + len(shown)
    head = f"{p.path}: lines {p.start_line}-{end} of {len(lines)}"
    if end < last:
        head += f" (asked for {p.max_lines}; one answer holds at most {READ_CHARS:,} characters)"
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
    context: int = Field(
        0, ge=0, le=5, description="Lines shown after each hit (e.g. a condition's body)."
    )
    skip: int = Field(
        0, ge=0, description="Hits to leave out first: where a full answer said to go on."
    )


class SearchHit(BaseModel):
    path: str
    line: int
    scope: str = ""
    """The enclosing class and function ('Scheduler.process_batch_result'); '' at module level
    or outside Python."""
    text: str
    after: list[str] = Field(default_factory=list)
    """The lines after it (search_files' `context`), as the file has them, each cut at 160."""


class SearchResult(BaseModel):
    """What search_files found: its hits, and how many files the glob matched and were read."""

    regex: str
    pattern: str
    files_matched: int
    files_skipped: int = 0
    """Matched files not searched: binary, or data over `MAX_SEARCHED_BYTES`."""
    hits: list[SearchHit] = Field(default_factory=list)
    truncated: bool = False
    """max_hits was reached before every matched file was searched."""
    skipped_hits: int = 0
    """Hits left out first (`skip`)."""
    folders: list[str] = Field(default_factory=list)
    """With no file matched: folders the glob names (a pattern for files stops at them)."""
    deeper: tuple[str, int, int] | None = None
    """With no hit, where a glob's '*' kept the search out of subfolders: the pattern that
    reaches them, how many more files it matches, and how many of their lines match."""

    def render(self) -> str:
        if not self.files_matched:
            text = f"no file matches the glob '{self.pattern}' (nothing searched; see list_files)"
            if self.folders:
                shown = ", ".join(self.folders[:3]) + (", ..." if len(self.folders) > 3 else "")
                text += f"; it names folders ({shown}): '{self.folders[0]}/**' searches inside"
            return text
        skipped = f" ({self.files_skipped} binary or data files not searched)" if self.files_skipped else ""  # fmt: skip
        if not self.hits and self.skipped_hits:
            return f"no hit after the first {self.skipped_hits} (skip={self.skipped_hits})"
        if not self.hits:
            files = f"{self.files_matched} file{'s' * (self.files_matched != 1)}"
            text = (
                f"no line matches /{self.regex}/ in the {files} matching '{self.pattern}'{skipped}"
            )
            if self.deeper is not None:
                pattern, more, matching = self.deeper
                text += (
                    f"; '*' stays within one folder: '{pattern}' reaches {more} more "
                    f"file{'s' * (more != 1)} in subfolders, where "
                    + (f"{matching} lines match" if matching != 1 else "1 line matches")
                )
            return text
        lines: list[str] = []
        size = 0
        for n, h in enumerate(self.hits):
            block = [f"{h.path}:{h.line}{f' (in {h.scope})' if h.scope else ''}: {h.text}"]
            block += [f"  {h.line + i + 1:>5}| {text}" for i, text in enumerate(h.after)]
            size += sum(len(line) + 1 for line in block)
            if size > SEARCH_CHARS and lines:  # whole hits only, and where to go on
                go_on = self.skipped_hits + n
                found = f"{len(self.hits) - n}{'+' * self.truncated} more hits found"
                lines.append(
                    f"[answer full after {n} hits (an answer holds {SEARCH_CHARS} characters, "
                    f"whatever max_hits; {found}): search again with skip={go_on} for the rest]"
                )
                return "\n".join(lines)
            lines += block
        if self.truncated:
            lines.append(f"[max_hits {len(self.hits)} reached; narrow the glob or raise max_hits]")
        return "\n".join(lines)


@tool(
    "search_files",
    "Search workspace files for a regular expression; each hit names its enclosing class and "
    "function (Python files).",
    SearchFiles,
)
def search_files(p: SearchFiles, ctx: ToolContext) -> ToolResult:
    try:
        rx = re.compile(p.regex)
    except re.error as exc:
        raise UserError(f"regex '{p.regex}' is invalid ({exc})") from exc
    tree = workspace_tree(ctx.task)
    names = _files(tree, p.pattern)
    result = SearchResult(
        regex=p.regex, pattern=p.pattern, files_matched=len(names), skipped_hits=p.skip
    )
    to_skip = p.skip
    if not names:
        rx_glob = glob_regex(p.pattern.rstrip("/"))
        parents = {n.rsplit("/", i)[0] for n in tree.files() for i in range(1, n.count("/") + 1)}
        result.folders = sorted(f for f in parents if rx_glob.match(f))
    for name in names:
        found = _matching_lines(tree, name, rx)
        if found is None:
            result.files_skipped += 1
            continue
        scopes = python_scopes(found[1]) if found[0] and name.endswith(".py") else []
        all_lines = found[1].splitlines() if p.context else []
        for number, line in found[0]:
            if to_skip:
                to_skip -= 1
                continue
            if len(result.hits) >= p.max_hits:
                result.truncated = True
                return ToolResult.of(result)
            after = [t.rstrip()[:160] for t in all_lines[number : number + p.context]]
            hit = SearchHit(path=name, line=number, scope=enclosing(scopes, number), text=line.strip()[:160], after=after)  # fmt: skip
            result.hits.append(hit)
    head, _, last = p.pattern.rpartition("/")
    if not result.hits and head and "**" not in p.pattern:
        deeper = f"{head}/**/{last}"
        more = sorted(set(_files(tree, deeper)) - set(names))
        if more:
            lines = sum(len(found[0]) for n in more if (found := _matching_lines(tree, n, rx)))
            result.deeper = (deeper, len(more), lines)
    return ToolResult.of(result)


def _matching_lines(
    tree: WorkspaceTree, name: str, rx: re.Pattern[str]
) -> tuple[list[tuple[int, str]], str] | None:
    """(line number, line) of each line of `name` that `rx` matches, and the text; None for a
    binary file or data over `MAX_SEARCHED_BYTES`."""
    data = tree.read_bytes(name)
    if len(data) > MAX_SEARCHED_BYTES or b"\0" in data[:8192]:
        return None
    text = data.decode(errors="replace")
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if rx.search(line)], text


Scope = tuple[int, int, str]
"""(first line, last line, qualified name) of a class or function."""


def python_scopes(source: str) -> list[Scope]:
    """Every class and function of a Python module with its line span ([] when it does not
    parse): what names a search hit's enclosing scope."""
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    scopes: list[Scope] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                scopes.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(module, "")
    return scopes


def enclosing(scopes: list[Scope], line: int) -> str:
    """The innermost scope holding `line` ('' at module level)."""
    inside = [s for s in scopes if s[0] <= line <= s[1]]
    return max(inside, key=lambda s: s[0])[2] if inside else ""
