"""What the model is told: the method (system prompt) and the task (first user message).

The system prompt is built from the tools the run offers and names no other. The first message
carries what a model needs to start without a wasted turn: the task as `describe_task` gives it
(story, metric, success criteria, knobs, the measured workload and, for a serving task, the
deployment: launch command, device, dtype, attention backend, model config), the workspace tree
(bounded; for an installed package only its editable globs and top-level folders), small
editable files inline under a size cap, the baseline and every budget.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from infra_agent.agent.state import Budget
from infra_agent.errors import UserError
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import is_editable
from infra_agent.tasks.tree import WorkspaceTree, workspace_tree
from infra_agent.tools.base import ToolRegistry
from infra_agent.tools.looks import LOOK_TOOLS
from infra_agent.tools.patching import task_overview

TREE_ENTRIES = 60
"""Workspace entries listed in the first message at most (then a count of the rest)."""
INLINE_CHARS = 8_000
"""Editable files shown inline in the first message, their text in all at most this long."""

PATCH_TOOLS = {
    "propose_patch": "propose_patch (a unified diff against the workspace, editable files only)",
    "edit_file": "edit_file (replace exact text in an editable file; edits accumulate)",
    "propose_knobs": "propose_knobs (a knob assignment)",
}
"""The tools that make a patch, as the system prompt names them (each only when offered)."""


def system_prompt(tools: ToolRegistry) -> str:
    """The method, naming only the tools this run offers: a sparse run hears of no instrument, a
    task without knobs of no propose_knobs."""
    offered = tools.names()
    instruments = [n for n in offered if (t := tools.get(n)) is not None and t.kind == "instrument"]
    reading = ", ".join(n for n in ("list_files", "read_file", "search_files") if n in offered)
    makers = [text for name, text in PATCH_TOOLS.items() if name in offered]
    patching = ", ".join(makers[:-1]) + " or " + makers[-1] if len(makers) > 1 else "".join(makers)
    method = "measure, form a hypothesis, test it cheaply" if instruments else "read the code, form a hypothesis"  # fmt: skip
    rules = ["Act only through the tools. Every reply must call at least one tool; arguments are JSON."]  # fmt: skip
    if instruments:
        rules.append(
            f"Read the code ({reading}) and ask the instruments ({', '.join(instruments)}) "
            "before guessing: they find what reading misses."
        )
    else:
        rules.append(f"Read the code ({reading}) before guessing.")
    if "lookup_skeletons" in offered:
        rules.append("lookup_skeletons finds known optimization patterns and how to test whether one applies.")  # fmt: skip
    if looks := [n for n in offered if n in LOOK_TOOLS]:
        rules.append(
            f"{', '.join(looks)} take any patch_id: look at a patch on its own server before you "
            "spend an experiment on it, and again after a win. A look is one sample, not a "
            "verdict; looks have a budget of their own."
        )
    if "capture" in offered:
        replays = " and ".join(n for n in ("microbench", "accuracy_diff") if n in offered)
        rules.append(
            "capture(function='sglang.module:Class.method') records that SGLang function's real "
            "arguments while the task's workload runs"
            + (f"; {replays}(captured=<its id>, patch_id=...) replay them against your patch "
               "in the real package: no shapes to guess." if replays else ".")
        )  # fmt: skip
    rules += [
        f"{patching} returns a patch_id; run_experiment(patch_id) verifies it against baseline: "
        "correctness on fresh inputs, interleaved timing with a 95% confidence interval, "
        "health.",
        "Only an IMPROVED verdict counts. INCORRECT, REJECTED and FAILED patches must be fixed "
        "or dropped; NO_CHANGE means the idea did not matter here, unless its answer says "
        "'extendable' (underpowered or unresolved): run_experiment(extend=<its experiment id>) "
        "then adds pairs on the same patch.",
        "Experiments are the scarce budget; do not re-run a patch that was already measured.",
        "The answers to each reply end with the budget line: what is used of every budget, "
        "with a warning past 75% and 90% of any of them. The run stops at the first one used up.",
        "Call finish(summary) when done. The best IMPROVED patch goes to a human reviewer.",
    ]
    return "\n".join(
        [
            "You are a senior infrastructure engineer optimizing an LLM serving system. Work like "
            f"one: {method}, patch, and prove the patch by experiment.",
            "",
            "Rules:",
            *(f"- {rule}" for rule in rules),
        ]
    )


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
    return "\n\n".join(
        [
            f"Objective of this run: {objective}.",
            task_overview(task, params),
            workspace_overview(task),
            f"Baseline: the unmodified workspace with default knobs (fingerprint "
            f"{fingerprint[:12]}); every experiment measures a patch against it.\n"
            f"Budget: {budget.render()} (the budget line after each reply says what is used).\n"
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
