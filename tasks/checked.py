"""A patch checked against its task once: applied to a private copy of the workspace, with what
that showed kept beside it, so that nothing after the check applies it to a copy again.

    checked = check_patch(patch, task)   # when the patch is proposed, or read from a file
    checked.refusal                      # the PatchError/UserError it was refused with, or None
    checked.files                        # each touched file before and after, as applied

The tool that registers a proposal builds it; the experiment's refusal check and static stage
and the review's commit read it instead of re-applying the diff. Only the candidate's sandbox
applies the patch again (for real). A patch from outside a run (a file, a stored proposal whose
task may have moved on) is checked where it comes in.
"""

from __future__ import annotations

import shutil
import stat
from dataclasses import dataclass, field
from typing import Any

from infra_agent.errors import UserError
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import NotEditableError, Patch, effective_knobs
from infra_agent.tasks.tree import preview_apply, workspace_tree


@dataclass(frozen=True)
class PatchedFile:
    """One file a diff touches: its bytes in the baseline tree and after the patch applied to a
    copy of it (None where the file does not exist), and the git file mode after."""

    path: str
    before: bytes | None
    after: bytes | None
    mode: str = "100644"
    """100644, or 100755 where the patched file is executable."""


@dataclass(frozen=True)
class CheckedPatch:
    """`patch` as task `task` takes it: its effective knobs and touched files, or its refusal."""

    patch: Patch
    task: str
    """The task's name: a checked patch is reused only for the task it was checked against."""
    knobs: dict[str, Any] = field(default_factory=dict)
    """Effective knob values for the candidate arm (the task defaults for a diff)."""
    files: tuple[PatchedFile, ...] = ()
    refusal: UserError | None = None
    """Why the task does not take the patch (a PatchError or a knob's bad value), or None."""

    @property
    def hash(self) -> str:
        """The patch's content hash (its patch_id)."""
        return self.patch.hash

    @property
    def not_editable(self) -> bool:
        """Refused for touching a file the task does not let change (a rule the cascade judges)."""
        return isinstance(self.refusal, NotEditableError)

    def accepted(self) -> CheckedPatch:
        """This checked patch, or its refusal raised."""
        if self.refusal is not None:
            raise self.refusal
        return self


def check_patch(patch: Patch, task: Task) -> CheckedPatch:
    """Check `patch` against `task` once: a knob assignment against the knob space, a diff by
    applying it to a private copy of the workspace (removed before this returns). A refusal is
    returned, not raised; any other error propagates."""
    try:
        knobs = effective_knobs(patch, task.manifest)
        files = _applied(patch, task) if patch.kind == "diff" else ()
    except UserError as exc:
        return CheckedPatch(patch=patch, task=task.name, refusal=exc)
    return CheckedPatch(patch=patch, task=task.name, knobs=knobs, files=files)


def _applied(patch: Patch, task: Task) -> tuple[PatchedFile, ...]:
    tree = workspace_tree(task)
    scratch = preview_apply(patch, task)
    try:
        files = []
        for rel in patch.files:
            new = scratch / "ws" / rel
            executable = new.is_file() and bool(new.stat().st_mode & stat.S_IXUSR)
            files.append(
                PatchedFile(
                    rel,
                    tree.read_bytes(rel) if tree.is_file(rel) else None,
                    new.read_bytes() if new.is_file() else None,
                    "100755" if executable else "100644",
                )
            )
        return tuple(files)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def checked(patch: Patch | CheckedPatch, task: Task) -> CheckedPatch:
    """`patch` checked against `task`: a checked patch as it is (when it was checked against this
    task), a plain one checked now."""
    if isinstance(patch, Patch):
        return check_patch(patch, task)
    if patch.task != task.name:
        raise UserError(f"patch {patch.patch.hash[:12]} was checked against task {patch.task}, not {task.name}")  # fmt: skip
    return patch


__all__ = ["CheckedPatch", "PatchedFile", "check_patch", "checked"]
