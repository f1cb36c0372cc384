"""`edit_file`: search-and-replace editing that produces the same checked patches as diffs.

An edit replaces one exact occurrence of `old` with `new` in a workspace file as the candidate
has it. Edits accumulate: by default an edit applies on top of the run's most recent diff patch
(from edit_file or propose_patch), and the returned patch_id is one unified diff against the
baseline covering every edit so far. `base="baseline"` starts a new candidate; `base=<patch_id>`
builds on that patch. The diff goes through `patching.check_and_store`, like propose_patch's:
the same editable-file checks, the same store, the same patch_id run_experiment consumes.
"""

from __future__ import annotations

import difflib
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tasks.patch import Patch
from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.context import ToolContext
from infra_agent.tools.patching import check_and_store

CLOSEST_SHOWN = 8
"""Lines of the file shown where `old` comes closest, when it matches nowhere."""
SHOWN_DIFF_LINES = 40
"""An edit's answer shows the whole patch when its diff is at most this long."""
MAX_WINDOWS = 400
"""At most this many places aligned on verbatim lines (those with most) are compared whole."""


def _lines(text: str) -> list[str]:
    """Lines with their '\\n' (only '\\n' breaks a line, as for git)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def file_diff(rel: str, before: str | None, after: str | None) -> str:
    """A unified diff of one file for `git apply -p1` (None: the file does not exist)."""
    old_name = f"a/{rel}" if before is not None else "/dev/null"
    new_name = f"b/{rel}" if after is not None else "/dev/null"
    out = []
    for line in difflib.unified_diff(_lines(before or ""), _lines(after or ""), old_name, new_name):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _base_patch(base: str, ctx: ToolContext) -> Patch | None:
    if base == "baseline":
        return None
    if base == "latest":
        for patch_id in reversed(ctx.known_patches):
            patch = ctx.patch(patch_id)
            if patch.kind == "diff":
                return patch
        return None
    patch = ctx.patch(base)
    if patch.kind != "diff":
        raise UserError(f"base '{base}' is a knob patch; edits build on a diff patch")
    return patch


def closest_lines(old: str, text: str) -> str:
    """Where `old` comes closest in `text`: the file's lines there, numbered (bounded)."""
    want = [w.strip() for w in old.strip("\n").split("\n")]
    lines = text.split("\n")
    have = [h.strip() for h in lines]
    last = max(0, len(lines) - len(want))
    # Candidate windows: aligned on a line of `old` found verbatim, or on the lines most like
    # its first line; only those are compared whole (a full scan is slow on large modules).
    at = {w: [j for j, x in enumerate(want) if x == w] for w in want if w}
    aligned = Counter(min(last, max(0, i - j)) for i, h in enumerate(have) for j in at.get(h, ()))
    starts = {start for start, _ in aligned.most_common(MAX_WINDOWS)}
    head = difflib.SequenceMatcher(None, want[0], "")
    first_like = []
    for i, h in enumerate(have):
        head.set_seq2(h)
        if head.real_quick_ratio() > 0.5 and head.quick_ratio() > 0.5:
            first_like.append((head.ratio(), i))
    starts |= {min(last, i) for _, i in sorted(first_like, reverse=True)[:20]}
    best, best_score = 0, 0.0
    for start in sorted(starts):
        window = "\n".join(have[start : start + len(want)])
        score = difflib.SequenceMatcher(None, "\n".join(want), window).ratio()
        if score > best_score:
            best, best_score = start, score
    shown = lines[best : best + min(len(want), CLOSEST_SHOWN)]
    body = "\n".join(f"{best + 1 + i:5d}  {line[:120]}" for i, line in enumerate(shown))
    note = (
        "; they differ from old only in indentation or trailing spaces: copy them exactly"
        if best_score == 1.0
        else ""
    )
    return f"closest lines ({best_score:.0%} similar ignoring indentation{note}):\n{body}"


class Replacement(BaseModel):
    old: str = Field(description="Exact text to replace; it must occur exactly once.")
    new: str = Field(description="The replacement text.")


class EditFile(BaseModel):
    path: str = Field(description="Workspace path of an editable file, e.g. 'attention.py'.")
    old: str = Field(
        description="Exact text to replace (whitespace and indentation included); it must "
        "occur exactly once in the file as the candidate has it. Include a few surrounding "
        "lines to make it unique."
    )
    new: str = Field(description="The replacement text.")
    also: list[Replacement] = Field(
        default_factory=list,
        description="More replacements in the same file, applied in order after the first, each "
        "matching exactly once: change several places without repeating the lines between them.",
    )
    rationale: str = Field("", description="Why this edit should improve the metric.")
    base: str = Field(
        "latest",
        description="'latest': build on your most recent diff patch (edits accumulate); "
        "'baseline': start a new candidate from the unmodified workspace; or a patch_id.",
    )


@tool(
    "edit_file",
    "Replace one exact occurrence of `old` with `new` in a workspace file (and, in `also`, more "
    "places of the same file); returns a patch_id "
    "for run_experiment. Edits accumulate: each applies on top of your most recent diff patch "
    "(edit_file or propose_patch), so the returned patch_id covers all edits so far; "
    "base='baseline' starts a new candidate.",
    EditFile,
    needs="code",
)
def edit_file(p: EditFile, ctx: ToolContext) -> ToolResult:
    from infra_agent.tasks.patch import apply_patch, is_editable, parse_diff
    from infra_agent.tasks.tree import workspace_tree

    manifest = ctx.task.manifest
    tree = workspace_tree(ctx.task)
    if not tree.inside(p.path) or not tree.is_file(p.path):
        raise UserError(f"no file '{p.path}' in the workspace (see list_files)")
    if not is_editable(p.path, manifest):
        raise UserError(
            f"'{p.path}' is not editable in task {manifest.name} "
            f"(editable: {', '.join(manifest.editable)})"
        )
    if not p.old:
        raise UserError("old is empty; give the exact text to replace")
    base = _base_patch(p.base, ctx)
    files = sorted(set(base.files if base else []) | {p.path})
    tmp = Path(tempfile.mkdtemp(prefix="infra-agent-edit-"))
    try:
        tree.checkout(tmp / "ws", files)
        if base is not None:
            apply_patch(base, ctx.task, tmp / "ws")
        target = tmp / "ws" / p.path
        try:
            text = target.read_bytes().decode()  # bytes: '\r\n' stays as the file has it
        except UnicodeDecodeError as exc:
            raise UserError(f"{p.path} is not UTF-8 text; edit it with propose_patch") from exc
        where = "the baseline" if base is None else f"patch {base.hash[:12]}"
        for i, (old, new) in enumerate([(p.old, p.new), *((r.old, r.new) for r in p.also)]):
            name = "old" if i == 0 else f"also[{i - 1}].old"
            if i and not old:
                raise UserError(f"{name} is empty; give the exact text to replace")
            count = text.count(old)
            if count == 0:
                after = f" after the {i} replacement{'s' * (i != 1)} before it" if i else ""
                raise UserError(
                    f"{name} matches 0 times in {p.path} (as in {where}{after}); "
                    f"{closest_lines(old, text)}"
                )
            if count > 1:
                at = [text[: m.start()].count("\n") + 1 for m in re.finditer(re.escape(old), text)]
                raise UserError(
                    f"{name} matches {count} times in {p.path} (lines "
                    f"{', '.join(map(str, at[:10]))}); include more surrounding lines so it "
                    "matches once"
                )
            text = text.replace(old, new, 1)
        target.write_bytes(text.encode())
        diff = "".join(
            file_diff(
                rel,
                tree.read_text(rel) if tree.is_file(rel) else None,
                (tmp / "ws" / rel).read_bytes().decode(errors="replace")
                if (tmp / "ws" / rel).is_file()
                else None,
            )
            for rel in files
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not diff:
        raise UserError("after this edit the candidate equals the baseline; nothing to propose")
    rationale = "; ".join(r for r in ((base.rationale if base else ""), p.rationale) if r)
    result = check_and_store(parse_diff(diff, author=ctx.author, rationale=rationale), ctx)
    built_on = f"built on {base.hash[:12]}" if base is not None else "built on the baseline"
    body = diff.splitlines()
    added = sum(1 for line in body if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in body if line.startswith("-") and not line.startswith("---"))
    shown = "\n" + diff.rstrip("\n") if len(body) <= SHOWN_DIFF_LINES else ""
    result.content = (
        f"{result.content}\n({built_on}; the patch against the baseline: +{added} -{removed} "
        f"lines in {len(files)} file{'s' * (len(files) != 1)}){shown}"
    )
    if result.data is not None:
        result.data["base"] = base.hash if base is not None else None
    return result
