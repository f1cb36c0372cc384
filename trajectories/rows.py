"""`openai-sft` and `rl` rows straight from a run's store records (the export's fast path).

`formats.sft_row` / `formats.rl_row` derive a row from the canonical `Trajectory`; building and
validating that record costs about a millisecond a run, most of an export's time. These functions
give the same rows from a `RunBundle` directly (tests/trajectories/test_rows.py holds them equal
on a realistic store), except that tool-call arguments are the model's text verbatim rather than
re-encoded from the parsed object (same JSON value, the model's own spacing). Rows come out *not yet redacted nor validated*: the exporter does both for a
whole batch at once (`Redactor.table` / `Redactor.texts`, then the format's Arrow schema and
`writers.check_table`).

The conversation follows the ATIF mapping of `build`: a tool result follows the assistant turn
that made its call (not necessarily its store position), harness notes never appear, and a tool
result with no call before it stands on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra_agent.experiments.verdict import Flag
from infra_agent.store.records import StepRecord
from infra_agent.trajectories.build import (
    RunBundle,
    best_candidate,
    patch_order,
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


def run_row(bundle: RunBundle, fmt: ExportFormat, weights: dict[str, float]) -> RunRow:
    """The `fmt` row (openai-sft or rl) of one run, unredacted. `weights`: component -> weight."""
    run = bundle.run
    messages = chat_messages(bundle.steps)
    called = {c.name for s in bundle.steps for c in s.tool_calls}
    tools = specs_for_tools(run.config.get("tools"), called)
    rewards = run_rewards(bundle, weights)
    reward = rewards.trajectory
    verdicts = [e.result.verdict.value for e in _by_patch(bundle)]
    best = best_candidate(bundle.experiments)
    reviewed = bundle.reviewed
    if fmt is ExportFormat.OPENAI_SFT:
        row = {
            "messages": messages,
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
        return RunRow(row, reward["total"], verdicts)
    if fmt is not ExportFormat.RL:
        raise ValueError(f"{fmt.value}: not a row format of this module")
    split = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    results = [e.result for e in bundle.experiments]
    totals = token_totals(bundle.steps)
    row = {
        "session_id": run.id,
        "task": run.task,
        "prompt": messages[:split],
        "completion": messages[split:],
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
            "n_messages": len(messages),
            "n_tool_calls": sum(len(s.tool_calls) for s in bundle.steps),
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
    return RunRow(row, reward["total"], verdicts)


def _by_patch(bundle: RunBundle) -> list[Any]:
    """The run's experiments grouped by patch, patches in `build`'s order."""
    return [
        e for patch_id in patch_order(bundle) for e in bundle.experiments if e.patch_id == patch_id
    ]


@dataclass
class _Turn:
    """One ATIF step: the message that opened it (None for harness notes and orphan tool
    results) and the tool results folded into it."""

    message: dict[str, Any] | None
    results: list[tuple[str | None, str]]
    """(tool_call_id, content) in order."""
    errors: dict[str | None, str]
    """tool_call_id -> the tool's error report (shown when the result is empty)."""


def chat_messages(records: list[StepRecord]) -> list[dict[str, Any]]:
    """The conversation the model saw, in OpenAI chat shape (`formats.chat_messages` of the
    run's `Trajectory`)."""
    turns: list[_Turn] = []
    owner: dict[str, _Turn] = {}  # tool_call_id -> the assistant turn that made the call
    last_agent: _Turn | None = None
    for rec in records:
        if rec.role == "tool":
            turn = owner.get(rec.tool_call_id or "") or last_agent
            if turn is None:  # a tool result with no call before it: keep it, on its own
                turn = _Turn(None, [], {})
                turns.append(turn)
            turn.results.append((rec.tool_call_id, rec.content))
            if rec.error:
                turn.errors[rec.tool_call_id] = rec.error
            continue
        if rec.role == "harness":  # a note of the agent loop: logged, never shown to the model
            turns.append(_Turn(None, [], {}))
            continue
        message: dict[str, Any] = {"role": rec.role, "content": rec.content}
        turn = _Turn(message, [], {})
        turns.append(turn)
        if rec.role != "assistant":
            continue
        last_agent = turn
        if rec.reasoning_content is not None:
            message["reasoning_content"] = rec.reasoning_content
        if rec.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments_text(call.arguments)},
                }
                for call in rec.tool_calls
            ]
            for call in rec.tool_calls:
                owner[call.id] = turn
    out: list[dict[str, Any]] = []
    for turn in turns:
        if turn.message is not None:
            out.append(turn.message)
        for call_id, content in turn.results:
            # An empty result with an error: the error is what the model was shown.
            shown = content or turn.errors.get(call_id) or ""
            out.append({"role": "tool", "content": shown, "tool_call_id": call_id})
    return out


def arguments_text(raw: str) -> str:
    """Tool-call arguments as chat JSON text: exactly what the model wrote (`{}` when blank).

    Not re-encoded: a JSON object keeps the model's own spacing (what a fine-tuned model should
    learn to write), and text that is not a JSON object stays as it was, as in `build`."""
    return raw if raw.strip() else "{}"
