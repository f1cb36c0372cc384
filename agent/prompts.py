"""What the model is told: the method (system prompt) and the task (first user message)."""

from __future__ import annotations

from infra_agent.agent.state import Budget
from infra_agent.tasks.manifest import Task

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


def task_message(task: Task, objective: str, budget: Budget, fingerprint: str) -> str:
    m = task.manifest
    direction = "higher is better" if m.metric.higher_is_better else "lower is better"
    knobs = ", ".join(m.knobs) or "none"
    return (
        f"Task: {m.name} ({m.kind}). Objective: {objective}.\n"
        f"Metric: {m.metric.name} [{m.metric.unit}], {direction}.\n"
        f"Story: {m.story.strip()}\n"
        f"Editable files: {', '.join(m.editable) or 'none'}. Knobs: {knobs}.\n"
        f"Baseline: the unmodified workspace with default knobs (fingerprint {fingerprint[:12]}); "
        f"every experiment measures a patch against it.\n"
        f"Budget: {budget.experiments} experiments, {budget.turns} replies, "
        f"{budget.tokens} tokens, {budget.wall_s:.0f} s.\n"
        "Start with describe_task."
    )
