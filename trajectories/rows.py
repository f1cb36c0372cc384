"""`openai-sft` and `rl` rows straight from a run's store records (the export's fast path).

`formats.sft_row` / `formats.rl_row` derive a row from the canonical `Trajectory`; building and
validating that record costs about a millisecond a run, most of an export's time. These functions
give the same rows from a `RunBundle` directly (tests/trajectories/test_rows.py holds them equal
on a realistic store), except that tool-call arguments are the model's text verbatim rather than
re-encoded from the parsed object (same JSON value, the model's own spacing). The steps are read
as plain step bodies (dicts in `StepRecord`'s JSON shape): the export passes the store's parsed
bodies (`trusted.load_trusted_runs`), other callers the records (dumped here); both give the
same bytes. Rows come out *not yet redacted nor validated*: the exporter does both for a
whole batch at once (`Redactor.table` / `Redactor.texts`, then the format's Arrow schema and
`writers.check_table`).

`run_row` makes the rows of JSONL exports and of the reference path; the Parquet export builds
the same rows column-wise for a whole batch (`chat_columns` for the messages and the step facts,
`run_columns` for rewards, metrics and proposals), and tests hold the two equal.

The conversation follows the ATIF mapping of `build`: a tool result follows the assistant turn
that made its call (not necessarily its store position), harness notes never appear, and a tool
result with no call before it stands on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra_agent.experiments.verdict import Flag
from infra_agent.trajectories.build import (
    RunBundle,
    best_candidate,
    run_rewards,
    token_totals,
)
from infra_agent.trajectories.formats import ExportFormat, specs_for_tools
from infra_agent.trajectories.rewards import weighted_total


@dataclass
class RunRow:
    """One run's row with what the exporter's filters and summary need."""

    row: dict[str, Any]
    reward: float
    """Trajectory reward under the export's weights."""
    verdicts: list[str]
    """Experiment verdicts in patch, then experiment order (`Trajectory.verdicts()`)."""
    skip: str | None = None
    """Why the run forms no row of a chat format ('no steps recorded', 'no assistant
    message'); None when it does."""


@dataclass
class StepFacts:
    """What a run's row reads of its steps besides the messages themselves."""

    n_steps: int
    n_messages: int
    """Messages the model saw: every step but the harness notes."""
    n_calls: int
    """Tool calls made by any step."""
    has_assistant: bool
    called: set[str]
    """Names of the tools the run called."""
    totals: dict[str, Any]
    """`build.token_totals` of the steps."""


def run_row(bundle: RunBundle, fmt: ExportFormat, weights: dict[str, float]) -> RunRow:
    """The `fmt` row (openai-sft or rl) of one run, unredacted. `weights`: component -> weight.

    The steps are read as step bodies (`step_bodies`): `bundle.step_bodies` when the store gave
    them (`trusted.load_trusted_runs`), else the records' dumps; both give the same row."""
    steps = step_bodies(bundle)
    called: set[str] = set()
    messages, n_calls, has_assistant = _conversation(steps, called)
    facts = StepFacts(
        len(steps), len(messages), n_calls, has_assistant, called, token_totals(steps)
    )
    return row_of(bundle, fmt, weights, facts, messages)


def row_of(
    bundle: RunBundle,
    fmt: ExportFormat,
    weights: dict[str, float],
    facts: StepFacts,
    messages: list[dict[str, Any]],
) -> RunRow:
    """`run_row` from the run's `facts` and its `chat_messages`."""
    run = bundle.run
    skip = None
    if not facts.n_steps:
        skip = "no steps recorded"
    elif not facts.has_assistant:
        skip = "no assistant message"
    tools = specs_for_tools(run.config.get("tools"), facts.called)
    rewards = run_rewards(bundle, weights)
    reward = rewards.trajectory
    verdicts = [e.result.verdict.value for e in by_patch(bundle)]
    best = best_candidate(bundle.experiments, rewards.scores)
    reviewed = bundle.reviewed
    if fmt is ExportFormat.OPENAI_SFT:
        row: dict[str, Any] = {
            "tools": tools,
            "metadata": {
                "session_id": run.id,
                "task": run.task,
                "reward": reward["total"],
                "verdicts": verdicts,
                "reviewed": reviewed,
                "best_speedup": best["best_speedup"],
            },
        }
        row = {"messages": messages, **row}
        return RunRow(row, reward["total"], verdicts, skip)
    if fmt is not ExportFormat.RL:
        raise ValueError(f"{fmt.value}: not a row format of this module")
    results = [e.result for e in bundle.experiments]
    totals = facts.totals
    row = {"session_id": run.id, "task": run.task}
    split = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    row["prompt"], row["completion"] = messages[:split], messages[split:]
    row |= {
        "tools": tools,
        "reward": reward["total"],
        "reward_components": reward["components"],
        "reward_weights": reward["weights"],
        "metrics": {
            "best_speedup": best["best_speedup"],
            "best_speedup_ci_low": best["best_speedup_ci_low"],
            "best_speedup_ci_high": best["best_speedup_ci_high"],
            "accuracy_outcome": best["accuracy_outcome"],
            "reviewed": reviewed,
            "suspicious": sum(Flag.SUSPICIOUS in r.flags for r in results),
            "n_messages": facts.n_messages,
            "n_tool_calls": facts.n_calls,
            "n_experiments": len(results),
            "total_prompt_tokens": totals["total_prompt_tokens"],
            "total_completion_tokens": totals["total_completion_tokens"],
            "total_cost_usd": totals["total_cost_usd"],
        },
        "verdicts": verdicts,
        "proposals": [
            {
                "proposal_id": p.id,
                "patch_id": p.patch_id,
                "status": p.status.value,
                "reward": weighted_total(scores, weights),
                "reward_components": scores,
            }
            for p, scores in rewards.proposals
        ],
    }
    return RunRow(row, reward["total"], verdicts, skip)


def by_patch(bundle: RunBundle) -> list[Any]:
    """The run's experiments grouped by patch, patches in `build`'s order (`patch_order`: first
    appearance, the experiments' patches before any proposal's)."""
    first: dict[str, int] = {}
    for e in bundle.experiments:
        first.setdefault(e.patch_id, len(first))
    if len(first) == len(bundle.experiments):  # one experiment per patch: already in order
        return bundle.experiments
    return sorted(bundle.experiments, key=lambda e: first[e.patch_id])


STEP_KEYS = frozenset({"role", "content", "reasoning_content", "tool_calls", "tool_call_id",
                       "error", "prompt_tokens", "completion_tokens", "cost_usd"})  # fmt: skip
"""The keys of a step body the rows read."""


def step_bodies(bundle: RunBundle) -> list[dict[str, Any]]:
    """The run's steps as bodies in `StepRecord.model_dump(mode="json")` shape (at least
    `STEP_KEYS`): the store's parsed bodies when the bundle carries them, else dumps of its
    records."""
    if bundle.step_bodies is not None:
        return bundle.step_bodies
    return [s.model_dump(mode="json", include=set(STEP_KEYS)) for s in bundle.steps]


def chat_messages(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation the model saw, in OpenAI chat shape (`formats.chat_messages` of the
    run's `Trajectory`), from step bodies (see `step_bodies`)."""
    return _conversation(steps, set())[0]


def _conversation(
    steps: list[dict[str, Any]], called: set[str]
) -> tuple[list[dict[str, Any]], int, bool]:
    """(`chat_messages`, tool calls made by any step, whether an assistant step exists), in one
    pass over the steps; adds the called tools' names to `called`."""
    n_calls = 0
    has_assistant = False
    # One ATIF step per entry: [opening message or None (harness note, orphan tool result),
    # [(tool_call_id, content) of the results folded into it], {tool_call_id: error}].
    turns: list[list[Any]] = []
    owner: dict[str, list[Any]] = {}  # tool_call_id -> the assistant turn that made the call
    last_agent: list[Any] | None = None
    for rec in steps:
        role = rec["role"]
        tool_calls = rec["tool_calls"]
        if tool_calls:
            n_calls += len(tool_calls)
            called.update([c["name"] for c in tool_calls])
        if role == "tool":
            call_id = rec["tool_call_id"]
            turn = owner.get(call_id or "") or last_agent
            if turn is None:  # a tool result with no call before it: keep it, on its own
                turn = [None, [], {}]
                turns.append(turn)
            turn[1].append((call_id, rec["content"]))
            if rec["error"]:
                turn[2][call_id] = rec["error"]
            continue
        if role == "harness":  # a note of the agent loop: logged, never shown to the model
            continue
        message: dict[str, Any] = {"role": role, "content": rec["content"]}
        turn = [message, [], {}]
        turns.append(turn)
        if role != "assistant":
            continue
        last_agent = turn
        has_assistant = True
        if rec["reasoning_content"] is not None:
            message["reasoning_content"] = rec["reasoning_content"]
        if tool_calls:
            calls = []
            for call in tool_calls:
                function = {"name": call["name"], "arguments": arguments_text(call["arguments"])}
                calls.append({"id": call["id"], "type": "function", "function": function})
                owner[call["id"]] = turn
            message["tool_calls"] = calls
    out: list[dict[str, Any]] = []
    for message, results, errors in turns:
        if message is not None:
            out.append(message)
        for call_id, content in results:
            # An empty result with an error: the error is what the model was shown.
            shown = content or errors.get(call_id) or ""
            out.append({"role": "tool", "content": shown, "tool_call_id": call_id})
    return out, n_calls, has_assistant


def arguments_text(raw: str) -> str:
    """Tool-call arguments as chat JSON text: exactly what the model wrote (`{}` when blank).

    Not re-encoded: a JSON object keeps the model's own spacing (what a fine-tuned model should
    learn to write), and text that is not a JSON object stays as it was, as in `build`."""
    return raw if raw.strip() else "{}"
