"""Patches: a unified diff against a task's workspace, or a knob assignment, with provenance.

A patch is refused (PatchError, a UserError with one line naming the problem) when it is not a
diff, is binary, creates a symlink or special file, touches a file outside the task's `editable`
globs (after normalizing `a/`/`b/` prefixes and rejecting absolute paths and `..`), modifies a file
that does not exist, does not apply cleanly, or is larger than the configured limit.

    patch = load_patch(Path("fix.diff"), max_bytes=1_000_000)
    knobs = apply_patch(patch, task, sandbox_root)   # effective knob values for this arm
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.store.records import PatchKind, PatchRecord
from infra_agent.tasks.manifest import Task, TaskManifest

DEFAULT_MAX_PATCH_BYTES = 1_000_000
_FILE_MODES = {"100644", "100755"}
"""Only regular files: a patch that creates a symlink could point into the harness."""


class PatchError(UserError):
    """A patch that cannot be accepted, with the reason in one line."""


class NotEditableError(PatchError):
    """The patch touches a file the task does not allow to change (a rule, not a typo)."""


class Patch(BaseModel):
    """A proposed change: `kind='diff'` (unified diff text) or `kind='knobs'` (name -> value)."""

    kind: Literal["diff", "knobs"]
    diff: str = ""
    knobs: dict[str, Any] = Field(default_factory=dict)
    author: str = "human"
    """Who proposed it: 'human', 'search', a model name."""
    rationale: str = ""

    @property
    def hash(self) -> str:
        """sha256 hex of the content (provenance excluded: same change, same hash). A diff is
        hashed byte for byte: line endings are content too (`git apply` keeps a carriage return)."""
        if self.kind == "diff":
            canonical = "diff\n" + self.diff
        else:
            canonical = "knobs\n" + json.dumps(self.knobs, sort_keys=True, default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def files(self) -> list[str]:
        """Workspace-relative paths the diff touches (empty for knob patches)."""
        if self.kind != "diff":
            return []
        return sorted({p for f in parse_files(self.diff) for p in f.paths()})

    @classmethod
    def from_record(cls, record: PatchRecord) -> Patch:
        """The patch a stored record holds. Its `hash` is computed from these bytes, so a record
        edited in place no longer hashes to the id it was filed under."""
        return cls(
            kind=record.kind.value,
            diff=record.diff,
            knobs=record.knobs,
            author=record.author,
            rationale=record.rationale,
        )

    def to_record(self) -> PatchRecord:
        return PatchRecord(
            id=self.hash,
            kind=PatchKind(self.kind),
            diff=self.diff,
            knobs=self.knobs,
            files=self.files,
            author=self.author,
            rationale=self.rationale,
        )


class FileChange(BaseModel):
    """One file's header in a unified diff."""

    old: str | None
    """Path before (None for a new file)."""
    new: str | None
    """Path after (None for a deleted file)."""

    def paths(self) -> list[str]:
        return [p for p in (self.old, self.new) if p is not None]


def _clean_path(raw: str, *, strip_prefix: bool) -> str | None:
    """Normalize a diff path; None for /dev/null. Refuses absolute paths and '..'."""
    raw = raw.split("\t")[0].strip()
    if raw.startswith('"'):
        raise PatchError(f"quoted path {raw} in patch (unusual characters are not accepted)")
    if raw == "/dev/null":
        return None
    if strip_prefix and (raw.startswith("a/") or raw.startswith("b/")):
        raw = raw[2:]
    path = PurePosixPath(raw)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise PatchError(f"patch path {raw!r} leaves the workspace (absolute or '..')")
    return "/".join(p for p in path.parts if p != ".")


_GIT_HEADER = re.compile(r"^diff --git (\S+) (\S+)$")


def parse_files(text: str) -> list[FileChange]:
    """The files a unified diff touches. Raises PatchError for binary, symlink or non-diffs."""
    lines = text.splitlines()
    changes: list[FileChange] = []
    old: str | None = None
    saw_minus = False
    for i, line in enumerate(lines):
        if line.startswith("GIT binary patch") or (
            line.startswith("Binary files ") and line.endswith(" differ")
        ):
            raise PatchError("binary patches are not accepted")
        for key in ("new file mode ", "new mode ", "deleted file mode ", "old mode "):
            if line.startswith(key) and line[len(key) :].strip() not in _FILE_MODES:
                raise PatchError(
                    f"patch sets file mode {line[len(key) :].strip()} (symlink or special file)"
                )
        if line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            raise PatchError("renames and copies are not accepted; use a plain diff")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old = _clean_path(line[4:], strip_prefix=True)
            saw_minus = True
        elif line.startswith("+++ ") and saw_minus:
            new = _clean_path(line[4:], strip_prefix=True)
            if old is None and new is None:
                raise PatchError("patch header names /dev/null on both sides")
            changes.append(FileChange(old=old, new=new))
            saw_minus = False
    if not changes:
        raise PatchError("not a unified diff (no '--- a/FILE' / '+++ b/FILE' headers found)")
    if not any(line.startswith("@@ ") for line in lines):
        raise PatchError("unified diff has no hunks ('@@ ... @@' lines)")
    _check_hunk_counts(lines)
    return changes


_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def _check_hunk_counts(lines: list[str]) -> None:
    """Refuse a hunk whose body disagrees with its header's line counts. `git apply` follows the
    counts: lines past them are skipped silently, so the change applied (and measured) would not
    be the change a reviewer reads."""
    i = 0
    while i < len(lines):
        match = _HUNK.match(lines[i])
        if match is None:
            i += 1
            continue
        header, i = i + 1, i + 1
        old, new = int(match.group(1) or 1), int(match.group(2) or 1)
        while old > 0 or new > 0:
            line = lines[i] if i < len(lines) else None
            tag = None if line is None else line[:1]
            if tag in (" ", ""):  # context (an empty line is context with its space stripped)
                old, new = old - 1, new - 1
            elif tag in ("-", "+"):
                old, new = (old - 1, new) if tag == "-" else (old, new - 1)
            elif tag != "\\":  # '\ No newline at end of file' counts nowhere
                raise PatchError(
                    f"hunk at patch line {header} has fewer lines than its header counts"
                )
            if old < 0 or new < 0:
                raise PatchError(
                    f"hunk at patch line {header} has more {'removed' if old < 0 else 'added'} "
                    "lines than its header counts"
                )
            i += 1
        while i < len(lines) and not lines[i].startswith(("@@ ", "diff ")):
            line = lines[i]
            if line == "-- ":  # `git format-patch` signature: the rest is not patch text
                return
            header_pair = line.startswith("--- ") and lines[i + 1 : i + 2] != []
            if header_pair and lines[i + 1].startswith("+++ "):
                break
            if line[:1] in ("+", "-", " "):
                raise PatchError(
                    f"patch line {i + 1} looks like part of the hunk at line {header}, but the "
                    "hunk header's line counts end before it (git would skip it silently)"
                )
            i += 1


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A workspace glob: '*' and '?' stay within one folder, '**' spans folders."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


def is_editable(path: str, manifest: TaskManifest) -> bool:
    return any(glob_regex(p).match(path) for p in manifest.editable)


def parse_diff(text: str, *, author: str = "human", rationale: str = "") -> Patch:
    """A diff patch from text; checks that it is a text unified diff (not where it applies)."""
    if "\x00" in text:
        raise PatchError("binary patches are not accepted (NUL byte in patch)")
    if not text.endswith("\n"):
        text += "\n"
    parse_files(text)
    return Patch(kind="diff", diff=text, author=author, rationale=rationale)


def knob_patch(knobs: dict[str, Any], *, author: str = "human", rationale: str = "") -> Patch:
    """A knob assignment patch (validated against a task when applied)."""
    if not knobs:
        raise PatchError("knob patch assigns no knobs")
    return Patch(kind="knobs", knobs=dict(knobs), author=author, rationale=rationale)


def load_patch(
    path: Path, *, max_bytes: int = DEFAULT_MAX_PATCH_BYTES, author: str | None = None,
    rationale: str | None = None,
) -> Patch:  # fmt: skip
    """Read a unified diff or a knobs TOML (`[knobs] name = value`, optional `author`,
    `rationale` at top level). Refuses files above `max_bytes` before reading them."""
    if not path.is_file():
        raise PatchError(f"patch file {path}: not found")
    size = path.stat().st_size
    if size > max_bytes:
        raise PatchError(f"patch file {path}: {size} bytes exceeds the limit of {max_bytes} bytes")
    raw = path.read_bytes()
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        raise PatchError(f"patch file {path}: binary content is not accepted") from exc
    if path.suffix == ".toml" or text.lstrip().startswith("[knobs]"):
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PatchError(f"patch file {path}: not valid TOML ({exc})") from exc
        knobs = data.get("knobs")
        if not isinstance(knobs, dict):
            raise PatchError(f"patch file {path}: knob patch needs a [knobs] table")
        return knob_patch(
            knobs,
            author=author or str(data.get("author", "human")),
            rationale=rationale if rationale is not None else str(data.get("rationale", "")),
        )
    try:
        return parse_diff(text, author=author or "human", rationale=rationale or "")
    except PatchError as exc:
        raise PatchError(f"patch file {path}: {exc}") from exc


def effective_knobs(patch: Patch | None, manifest: TaskManifest) -> dict[str, Any]:
    """Task defaults overlaid with the patch's (validated) knob assignment."""
    knobs = {name: knob.default for name, knob in manifest.knobs.items()}
    if patch is None or patch.kind != "knobs":
        return knobs
    for name, value in patch.knobs.items():
        if name not in manifest.knobs:
            known = ", ".join(sorted(manifest.knobs)) or "none"
            raise PatchError(f"unknown knob '{name}' for task {manifest.name} (knobs: {known})")
        knobs[name] = manifest.knobs[name].validate_value(name, value)
    return knobs


def check_diff(patch: Patch, manifest: TaskManifest, root: Path) -> list[FileChange]:
    """Refuse a diff touching non-editable or missing files; return its file changes."""
    changes = parse_files(patch.diff)
    for change in changes:
        for path in change.paths():
            if not is_editable(path, manifest):
                raise NotEditableError(
                    f"patch touches '{path}', which is not editable in task {manifest.name} "
                    f"(editable: {', '.join(manifest.editable)})"
                )
        if change.old is not None and not (root / change.old).is_file():
            raise PatchError(
                f"patch modifies '{change.old}', which does not exist in the workspace"
            )
        if change.old is not None and (root / change.old).is_symlink():
            raise PatchError(f"patch modifies '{change.old}', which is a symlink")
        if change.old is None and change.new is not None and (root / change.new).exists():
            raise PatchError(f"patch creates '{change.new}', which already exists")
    return changes


def git_apply(
    diff: str, root: Path, *, check: bool, reverse: bool = False
) -> subprocess.CompletedProcess[str]:
    """`git apply` of `diff` to the files under `root` (no repository needed or discovered)."""
    git = shutil.which("git")
    if git is None:
        raise UserError("git is needed to apply patches and was not found on PATH")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root),
        # Never discover a repository above the workspace copy: apply to these files only.
        "GIT_CEILING_DIRECTORIES": str(root.resolve().parent),
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    argv = [git, "apply", "--whitespace=nowarn", "-p1"]
    argv += (["--check"] if check else []) + (["--reverse"] if reverse else []) + ["-"]
    return subprocess.run(
        argv, input=diff, cwd=root, env=env, capture_output=True, text=True, timeout=60
    )


def apply_patch(patch: Patch, task: Task, root: Path) -> dict[str, Any]:
    """Apply `patch` to the workspace copy at `root`; return the effective knobs.

    Diffs are checked first (`git apply --check`), so a refused patch leaves `root` unchanged."""
    manifest = task.manifest
    if patch.kind == "knobs":
        return effective_knobs(patch, manifest)
    check_diff(patch, manifest, root)
    result = git_apply(patch.diff, root, check=True)
    if result.returncode != 0:
        from infra_agent.tasks.hunks import explain_mismatch

        why = (result.stderr.strip().splitlines() or ["git apply failed"])[0]
        detail = explain_mismatch(patch.diff, root)
        raise PatchError(
            f"patch does not apply cleanly: {why.removeprefix('error: ')}"
            + (f"\n{detail}" if detail else "")
        )
    result = git_apply(patch.diff, root, check=False)
    if result.returncode != 0:
        raise PatchError(f"patch failed to apply: {result.stderr.strip()[:200]}")
    return effective_knobs(None, manifest)
