"""Where a diff's changes are: the functions around the lines it changes.

`fault_sites(task)` names the functions the task's inject.patch changes (read from the injected
tree), or, for a fault that is the engine's own code, the functions its `[fault] sites` declare:
for checking a diagnosis after the fact, and for telling a win at the fault from a win
elsewhere. Nothing shown to the agent and no instrument reads it.

    has_fault(task)              # True: an injected fault or declared sites (nothing is read)
    fault_sites(task)            # {("sglang/srt/managers/scheduler.py", "process_batch_result")}
    at_fault(task, patch)        # True: the patch changes a function the fault lives in;
                                 # False: it wins elsewhere; None: the task names no fault
"""

from __future__ import annotations

import ast
import re
import shutil
from collections.abc import Callable

from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import Patch, PatchError
from infra_agent.tasks.tree import preview_apply, workspace_tree

Site = tuple[str, str]
"""(module path in the tree, function name)."""

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def has_fault(task: Task) -> bool:
    """Whether the task names a fault: an inject.patch, or `[fault] sites` declared (cheap: no
    tree is built)."""
    return task.inject_patch is not None or bool(task.manifest.fault and task.manifest.fault.sites)


def fault_sites(task: Task) -> set[Site]:
    """(module path, function name) around every line the task's inject.patch changes, read from
    the injected tree; without one, the sites its `[fault]` declares. Empty for a task that names
    no fault."""
    if task.inject_patch is None:
        declared = task.manifest.fault.sites if task.manifest.fault is not None else []
        return {(path, function) for path, _, function in (s.partition("::") for s in declared)}
    tree = workspace_tree(task)
    return _sites(_lines(task.inject_patch.read_text(), new=True), tree.read_text)


def patch_sites(task: Task, patch: Patch) -> set[Site]:
    """The functions a diff changes: around its added lines in the patched tree, and around its
    removed lines in the task's baseline tree (so a function it deletes whole still counts).
    Empty for a knob patch."""
    if patch.kind != "diff":
        return set()
    before = _sites(_lines(patch.diff, new=False), workspace_tree(task).read_text)
    scratch = preview_apply(patch, task)
    try:
        return before | _sites(_lines(patch.diff, new=True), lambda rel: (scratch / "ws" / rel).read_text())  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def at_fault(task: Task, patch: Patch) -> bool | None:
    """Whether `patch` changes a function the task's injected fault lives in (ISO-Bench's true
    success, against a win found elsewhere); None for a task that names no fault. A patch that
    no longer applies counts as elsewhere."""
    faults = fault_sites(task)
    if not faults:
        return None
    try:
        return bool(patch_sites(task, patch) & faults)
    except PatchError:
        return False


def _sites(lines: dict[str, list[int]], read: Callable[[str], str]) -> set[Site]:
    sites: set[Site] = set()
    for rel, numbers in lines.items():
        if not rel.endswith(".py") or not numbers:
            continue
        try:
            tree = ast.parse(read(rel))
        except (OSError, SyntaxError, ValueError):
            continue
        functions = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        for number in numbers:
            around = [f for f in functions if f.lineno <= number <= (f.end_lineno or f.lineno)]
            if around:
                sites.add((rel, max(around, key=lambda f: f.lineno).name))
    return sites


def _lines(diff: str, new: bool) -> dict[str, list[int]]:
    """Per file, line numbers of what the diff changes. new=True: in the new file, each added
    line and where lines were removed; new=False: in the old file, each removed line."""
    changed: dict[str, list[int]] = {}
    current: list[int] | None = None
    old_no = new_no = 0
    for line in diff.splitlines():
        if line.startswith("+++ ") or line.startswith("--- "):
            path = line[4:].split("\t")[0].strip()
            if path != "/dev/null" and line.startswith("+++ " if new else "--- "):
                current = changed.setdefault(path[2:] if path[:2] in ("a/", "b/") else path, [])
            elif line.startswith("+++ " if new else "--- "):
                current = None
        elif current is None:
            continue
        elif match := _HUNK.match(line):
            old_no, new_no = int(match.group(1)), int(match.group(2))
        elif line.startswith("+"):
            if new:
                current.append(new_no)
            new_no += 1
        elif line.startswith("-"):
            current.append(new_no if new else old_no)
            old_no += 1
        elif not line.startswith("\\"):
            old_no, new_no = old_no + 1, new_no + 1
    return changed
