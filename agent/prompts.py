"""What the model is told: the method (system prompt) and the task (first user message).

The first message carries what a model needs to start without a wasted turn: the task as
`describe_task` gives it (story, metric, success criteria, knobs), the workspace tree (bounded;
for an installed package only its editable globs and top-level folders), small editable files
inline under a size cap, the baseline and the budget.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from infra_agent.agent.state import Budget
from infra_agent.errors import UserError
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import is_editable
from infra_agent.tasks.tree import WorkspaceTree, workspace_tree
from infra_agent.tools.patching import published_workload, task_description

TREE_ENTRIES = 60
"""Workspace entries listed in the first message at most (then a count of the rest)."""
INLINE_CHARS = 8_000
"""Editable files shown inline in the first message, their text in all at most this long."""

SYSTEM_PROMPT = """\
You are a senior infrastructure engineer optimizing an LLM serving system. Work like one:
measure, form a hypothesis, test it cheaply, patch, and prove the patch by experiment.

Rules:
- Act only through the tools. Every reply must call at least one tool; arguments are JSON.
- Read the code (list_files, read_file, search_files) and ask the instruments before guessing.
- lookup_skeletons finds known optimization patterns and how to test whether one applies.
- propose_patch (a unified diff against the workspace, editable files only) or propose_knobs
  returns a patch_id; run_experiment(patch_id) verifies it against baseline: correctness on
  fresh inputs and against float64, interleaved timing with a 95% confidence interval, health.
- Only an IMPROVED verdict counts. INCORRECT, REJECTED and FAILED patches must be fixed or
  dropped; NO_CHANGE means the idea did not matter here.
- Experiments are the scarce budget; do not re-run a patch that was already measured.
- Call finish(summary) when done. The best IMPROVED patch goes to a human reviewer.
"""


def _package_tree(task: Task, names: list[str]) -> list[str]:
    """An installed package: what a patch may change and the folders below the package, counted."""
    spec, m = task.manifest.workspace, task.manifest
    editable = sum(is_editable(n, m) for n in names)
    lines = [
        f"the installed {spec.package} {spec.version} package, {len(names)} files "
        f"({editable} editable: {', '.join(m.editable) or 'none'}); read any with read_file, "
        "list a folder with list_files, find code with search_files",
    ]
    counts = Counter(n.split("/")[1] + ("/" if n.count("/") > 1 else "") for n in names)
    top = names[0].split("/")[0] if names else ""
    entries = [f"{top}/{k}  ({n} file{'s' * (n != 1)})" if k.endswith("/") else f"{top}/{k}" for k, n in sorted(counts.items())]  # fmt: skip
    return lines + _bounded(entries)


def _bounded(entries: list[str]) -> list[str]:
    if len(entries) <= TREE_ENTRIES:
        return entries
    rest = len(entries) - TREE_ENTRIES
    return [*entries[:TREE_ENTRIES], f"... and {rest} more (list_files)"]


def _inline(tree: WorkspaceTree, task: Task, names: list[str]) -> list[str]:
    """Editable files inline while their text fits under INLINE_CHARS; the rest named."""
    shown, left_out, used = [], [], 0
    for name in (n for n in names if is_editable(n, task.manifest)):
        text = tree.read_text(name)
        if used + len(text) > INLINE_CHARS or "\0" in text:
            left_out.append(f"{name} ({len(text)} chars)")
            continue
        used += len(text)
        shown.append(f"```{name}\n{text.rstrip()}\n```")
    if left_out:
        shown.append(f"Not inline (over {INLINE_CHARS} chars in all; read_file): {', '.join(left_out)}")  # fmt: skip
    return shown


def workspace_overview(task: Task) -> str:
    """The workspace tree (bounded) and, for a task folder, its small editable files inline."""
    try:
        tree = workspace_tree(task)
        names = tree.files()
    except UserError as exc:
        return f"Workspace: not available ({exc})"
    if task.manifest.workspace.package is not None:
        return "\n".join(["Workspace:", *_package_tree(task, names)])
    entries = [f"{n}  (editable)" if is_editable(n, task.manifest) else n for n in names]
    inline = _inline(tree, task, names)
    shown = ["Editable files:", *inline] if inline else []
    return "\n".join(["Workspace files:", *_bounded(entries), *shown])


def task_message(
    task: Task, objective: str, budget: Budget, fingerprint: str, params: dict[str, Any]
) -> str:
    workload = published_workload(task, params)
    description = task_description(task.manifest)
    return "\n\n".join(
        [
            f"Objective of this run: {objective}.",
            f"{description}\n{workload}" if workload else description,
            workspace_overview(task),
            f"Baseline: the unmodified workspace with default knobs (fingerprint "
            f"{fingerprint[:12]}); every experiment measures a patch against it.\n"
            f"Budget: {budget.experiments} experiments, {budget.turns} replies, "
            f"{budget.tokens} tokens, {budget.wall_s:.0f} s.\n"
            "describe_task shows this task description again; read_file shows a file with line "
            "numbers.",
        ]
    )


LAST_TURN_REFUSAL = "the budget is used up; only finish is available in this last reply"
LAST_TURN_NOTE = (
    "The budget is used up ({reason}). This is your last reply and only finish is available: "
    "call finish(summary) with what the experiments above proved, what did not work and why, "
    "and what you would try next. The best IMPROVED patch goes to a human reviewer."
)
