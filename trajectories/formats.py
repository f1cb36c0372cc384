"""Export formats: each is a row model and a pure function from a `Trajectory` to a row.

- `openai-sft`: one conversation per row, OpenAI chat fine-tuning shape: `messages` (assistant
  `tool_calls` with `arguments` as JSON *text*, tool results as `role: tool`), `tools`, and a
  `metadata` object (run id, task, reward, verdicts) for filtering.
- `rl`: one row per trajectory in the verifiers shape: `prompt` (messages before the first
  assistant turn), `completion` (the rest), `reward`, `reward_components`, `reward_weights`,
  `metrics`, `verdicts`, and per-proposal rewards.
- `atif`: the canonical `Trajectory` record itself.

A row holds every field of its model (null where absent), so JSONL and Parquet carry the same
columns and values. The Parquet schema is derived from the row model (`arrow_schema`): a value
whose shape varies between rows (a tool's JSON schema, tool-call arguments, free-form extras) is
a JSON value in JSONL and a column of Parquet's JSON type, which `datasets` decodes back to the
same value; `arrow.read_rows` reads either file back to the rows as written.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from infra_agent.trajectories.arrow import arrow_schema
from infra_agent.trajectories.atif import Trajectory
from infra_agent.trajectories.rewards import Components, RewardWeights


class ExportFormat(str, Enum):
    OPENAI_SFT = "openai-sft"
    RL = "rl"
    ATIF = "atif"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(_Strict):
    name: str
    arguments: str
    """The model's text verbatim (`{}` when blank), whether or not it is a JSON object."""


class ChatToolCall(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None


class SftMetadata(_Strict):
    session_id: str
    task: str
    reward: float
    verdicts: list[str]
    reviewed: bool
    best_speedup: float | None = None


class SftRow(_Strict):
    messages: list[ChatMessage]
    tools: list[dict[str, Any]]
    metadata: SftMetadata


class OpenAIMessage(_Strict):
    """A chat message with only the keys OpenAI's fine-tuning API accepts."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None


class OpenAIChatRow(_Strict):
    """One line of OpenAI's chat fine-tuning file (`--strict-openai`): no metadata, no reasoning."""

    messages: list[OpenAIMessage]
    tools: list[dict[str, Any]]


class RlMetrics(_Strict):
    best_speedup: float | None = None
    best_speedup_ci_low: float | None = None
    best_speedup_ci_high: float | None = None
    accuracy_outcome: str
    reviewed: bool
    suspicious: int
    n_messages: int
    """Messages the model saw (prompt + completion)."""
    n_tool_calls: int
    n_experiments: int
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cost_usd: float | None = None


class ProposalReward(_Strict):
    proposal_id: str
    patch_id: str
    status: str
    reward: float
    reward_components: Components


class RlRow(_Strict):
    session_id: str
    task: str
    prompt: list[ChatMessage]
    completion: list[ChatMessage]
    tools: list[dict[str, Any]]
    reward: float
    reward_components: Components
    reward_weights: RewardWeights
    metrics: RlMetrics
    verdicts: list[str]
    proposals: list[ProposalReward]


# -- rows from a trajectory ------------------------------------------------------------------
def chat_messages(t: Trajectory) -> list[dict[str, Any]]:
    """The conversation the model saw, in OpenAI chat shape: one message per store message in
    order (a tool result right after the turn that made its call), except the agent loop's own
    notes (`harness` steps), which never reached the model."""
    out: list[dict[str, Any]] = []
    for step in t.steps:
        ext = step.extra
        if ext.role == "harness":  # a note of the agent loop: logged, never shown to the model
            continue
        if ext.role != "tool":  # a step opened by an orphan tool result carries only results
            calls = None
            if step.tool_calls:
                raw = {r.tool_call_id: r.raw for r in ext.raw_tool_arguments}
                calls = [
                    {"id": c.tool_call_id, "type": "function", "function": {
                        "name": c.function_name,
                        "arguments": raw.get(c.tool_call_id) or json.dumps(c.arguments, ensure_ascii=False),
                    }}
                    for c in step.tool_calls
                ]  # fmt: skip
            out.append(_message(
                "assistant" if step.source == "agent" else step.source, step.message,
                reasoning=step.reasoning_content, calls=calls,
            ))  # fmt: skip
        if step.observation is not None:
            errors = {e.source_call_id: e.error for e in ext.tool_errors}
            for result in step.observation.results:
                # An empty result with an error: the error is what the model was shown.
                content = result.content or errors.get(result.source_call_id) or ""
                out.append(_message("tool", content, call_id=result.source_call_id))
    return out


def _message(
    role: str,
    content: str,
    *,
    reasoning: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    call_id: str | None = None,
) -> dict[str, Any]:
    return {"role": role, "content": content, "reasoning_content": reasoning,
            "tool_calls": calls, "tool_call_id": call_id}  # fmt: skip


def tool_specs(t: Trajectory) -> list[dict[str, Any]]:
    """The tools offered to the model, as OpenAI function specs: the run config's `tools` when the
    run recorded them; otherwise the agent's tool registry (same code version as the export) plus
    a minimal spec for any tool the model called that the registry does not know."""
    recorded = json.loads(t.extra.run.config_json).get("tools")
    if isinstance(recorded, list) and all(isinstance(x, dict) for x in recorded):
        return recorded
    called = {c.function_name for s in t.steps for c in (s.tool_calls or [])}
    if not called:
        return []
    registry, known = _registry()
    if not known & called:  # not an agent-registry run: describe only what was called
        registry, known = [], frozenset()
    if called <= known:
        return registry  # the same list in every row: encoded once per batch
    minimal = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in sorted(called - known)
    ]
    return registry + minimal


@functools.cache
def _registry() -> tuple[list[dict[str, Any]], frozenset[str]]:
    from infra_agent.tools.registry import default_registry

    specs = default_registry().schemas()
    return specs, frozenset(spec["function"]["name"] for spec in specs)


def sft_row(t: Trajectory) -> dict[str, Any]:
    out = t.final_metrics.extra
    return {
        "messages": chat_messages(t),
        "tools": tool_specs(t),
        "metadata": {
            "session_id": t.session_id,
            "task": t.extra.task.id,
            "reward": out.reward,
            "verdicts": [v.value for v in t.verdicts()],
            "reviewed": out.reviewed,
            "best_speedup": out.best_speedup,
        },
    }


def rl_row(t: Trajectory) -> dict[str, Any]:
    messages = chat_messages(t)
    split = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    out, fm, reward = t.final_metrics.extra, t.final_metrics, t.extra.reward
    return {
        "session_id": t.session_id,
        "task": t.extra.task.id,
        "prompt": messages[:split],
        "completion": messages[split:],
        "tools": tool_specs(t),
        "reward": reward.total,
        "reward_components": reward.components.model_dump(),
        "reward_weights": reward.weights.model_dump(),
        "metrics": {
            "best_speedup": out.best_speedup,
            "best_speedup_ci_low": out.best_speedup_ci_low,
            "best_speedup_ci_high": out.best_speedup_ci_high,
            "accuracy_outcome": out.accuracy_outcome,
            "reviewed": out.reviewed,
            "suspicious": out.suspicious,
            "n_messages": len(messages),
            "n_tool_calls": out.tool_calls,
            "n_experiments": sum(len(p.experiments) for p in t.extra.patches),
            "total_prompt_tokens": fm.total_prompt_tokens,
            "total_completion_tokens": fm.total_completion_tokens,
            "total_cost_usd": fm.total_cost_usd,
        },
        "verdicts": [v.value for v in t.verdicts()],
        "proposals": [
            {
                "proposal_id": p.proposal_id,
                "patch_id": p.patch_id,
                "status": p.status.value,
                "reward": p.reward.total,
                "reward_components": p.reward.components.model_dump(),
            }
            for p in t.extra.proposals
        ],
    }


def atif_row(t: Trajectory) -> dict[str, Any]:
    return t.model_dump(mode="json")


def strict_openai_row(row: dict[str, Any]) -> dict[str, Any]:
    """An `openai-sft` row cut down to what OpenAI's fine-tuning API accepts."""
    messages = [
        {k: v for k, v in m.items() if v is not None and k != "reasoning_content"}
        for m in row["messages"]
    ]
    return {"messages": messages, "tools": row["tools"]}


@dataclass(frozen=True)
class Format:
    """An export format: its row model and how a trajectory becomes a row."""

    model: type[BaseModel]
    row: Callable[[Trajectory], dict[str, Any]]
    needs_conversation: bool
    """A run without an assistant message forms no row."""

    @functools.cached_property
    def schema(self) -> pa.Schema:
        return arrow_schema(self.model)


FORMATS: dict[ExportFormat, Format] = {
    ExportFormat.OPENAI_SFT: Format(SftRow, sft_row, needs_conversation=True),
    ExportFormat.RL: Format(RlRow, rl_row, needs_conversation=True),
    ExportFormat.ATIF: Format(Trajectory, atif_row, needs_conversation=False),
}
