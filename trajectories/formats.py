"""Export row formats built from `Trajectory` records, each a pydantic model plus an Arrow schema.

- `openai-sft`: one conversation per row, OpenAI chat fine-tuning shape: `messages` (assistant
  `tool_calls` with `arguments` as JSON *text*, tool results as `role: tool`), `tools`, and a
  `metadata` object (run id, task, reward, verdicts) for filtering.
- `rl`: one row per trajectory in the verifiers shape: `prompt` (messages before the first
  assistant turn), `completion` (the rest), `reward`, `reward_components`, `reward_weights`,
  `metrics`, `verdicts`, and per-proposal rewards.
- `atif`: the canonical `Trajectory` records themselves.

Parquet keeps fixed-shape values as typed columns (messages are list<struct>) and stores values
whose keys or types vary between rows (tool JSON schemas, ATIF steps and extras) as JSON text,
so Arrow never has to unify differing structs.
"""

from __future__ import annotations

import functools
import json
from enum import Enum
from typing import Any, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

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
    """JSON text: exports write the model's text verbatim (`{}` when blank), whether or not it is
    a JSON object; `chat_messages` re-encodes the ATIF object (the raw text when not one)."""


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


def strict_openai_row(row: dict[str, Any]) -> dict[str, Any]:
    """An `openai-sft` row cut down to what OpenAI's fine-tuning API accepts."""
    messages = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in row["messages"]]
    return {"messages": messages, "tools": row["tools"]}


class RlMetrics(_Strict):
    # Optional fields default to None: JSONL rows omit nulls and must validate again when read.
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
    order, except the agent loop's own notes (`harness` steps), which never reached the model."""
    out: list[dict[str, Any]] = []
    for step in t.steps:
        ext = step.extra
        if ext.role == "harness":  # a note of the agent loop: logged, never shown to the model
            continue
        if ext.role != "tool":  # a step opened by an orphan tool result carries only results
            message: dict[str, Any] = {
                "role": "assistant" if step.source == "agent" else step.source,
                "content": step.message,
            }
            if step.reasoning_content is not None:
                message["reasoning_content"] = step.reasoning_content
            if step.tool_calls:
                raw = {r.tool_call_id: r.raw for r in ext.invalid_tool_arguments}
                message["tool_calls"] = [
                    {
                        "id": c.tool_call_id,
                        "type": "function",
                        "function": {
                            "name": c.function_name,
                            "arguments": raw.get(c.tool_call_id)
                            or json.dumps(c.arguments, ensure_ascii=False),
                        },
                    }
                    for c in step.tool_calls
                ]
            out.append(message)
        if step.observation is not None:
            errors = {e.source_call_id: e.error for e in ext.tool_errors}
            for result in step.observation.results:
                # An empty result with an error: the error is what the model was shown.
                content = result.content or errors.get(result.source_call_id) or ""
                out.append(
                    {"role": "tool", "content": content, "tool_call_id": result.source_call_id}
                )
    return out


def tool_specs(t: Trajectory) -> list[dict[str, Any]]:
    """The tools offered to the model, as OpenAI function specs (see `specs_for_tools`)."""
    config = json.loads(t.extra.run.config_json)
    called = {c.function_name for s in t.steps for c in (s.tool_calls or [])}
    return specs_for_tools(config.get("tools"), called)


def specs_for_tools(recorded: Any, called: set[str]) -> list[dict[str, Any]]:
    """The run config's `tools` (`recorded`) when the agent recorded them as a list of specs;
    otherwise the agent's tool registry (same code version as the export) plus a minimal spec for
    any tool the model called (`called`) that the registry does not know."""
    if isinstance(recorded, list) and all(isinstance(x, dict) for x in recorded):
        return recorded
    if not called:
        return []
    names = sorted(called)
    registry, known = _registry_specs(), _registry_names()
    if not known & called:  # not an agent-registry run: describe only what was called
        registry = []
    unknown = [n for n in names if n not in known or not registry]
    if not unknown:
        return registry  # the same list object for every row: writers encode it once
    minimal = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in unknown
    ]
    return registry + minimal


@functools.lru_cache(maxsize=1)
def _registry_names() -> frozenset[str]:
    return frozenset(spec["function"]["name"] for spec in _registry_specs())


@functools.lru_cache(maxsize=1)
def _registry_specs() -> list[dict[str, Any]]:
    from infra_agent.tools.registry import default_registry

    return default_registry().schemas()


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
    out, fm = t.final_metrics.extra, t.final_metrics
    reward = t.extra.reward
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


ATIF_JSON_COLUMNS = ("agent", "steps", "final_metrics", "extra")


def atif_parquet_row(t: Trajectory) -> dict[str, Any]:
    """Scalar columns for filtering, plus each nested part of the record as JSON text."""
    data = t.model_dump(mode="json")
    return {
        "schema_version": t.schema_version,
        "session_id": t.session_id,
        "task": t.extra.task.id,
        "created_at": t.extra.run.created_at.isoformat(),
        "reward": t.final_metrics.extra.reward,
        "total_steps": t.final_metrics.total_steps,
        "notes": t.notes,
        **{f"{k}_json": json.dumps(data[k], ensure_ascii=False) for k in ATIF_JSON_COLUMNS},
    }


def trajectory_from_parquet_row(row: dict[str, Any]) -> Trajectory:
    """Rebuild the canonical record from an `atif` Parquet row (the inverse of atif_parquet_row)."""
    data = {k: json.loads(row[f"{k}_json"]) for k in ATIF_JSON_COLUMNS}
    return Trajectory.model_validate(
        {
            "schema_version": row["schema_version"],
            "session_id": row["session_id"],
            "notes": row["notes"],
            **data,
        }
    )


# -- Arrow schemas ---------------------------------------------------------------------------
_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("reasoning_content", pa.string()),
        (
            "tool_calls",
            pa.list_(
                pa.struct(
                    [
                        ("id", pa.string()),
                        ("type", pa.string()),
                        (
                            "function",
                            pa.struct([("name", pa.string()), ("arguments", pa.string())]),
                        ),
                    ]
                )
            ),
        ),
        ("tool_call_id", pa.string()),
    ]
)
MESSAGE_TYPE = _MESSAGE
"""A chat message (`ChatMessage`) as an Arrow struct."""
_COMPONENTS = pa.struct([(name, pa.float64()) for name in Components.model_fields])
_RL_METRICS = pa.struct(
    [
        ("best_speedup", pa.float64()),
        ("best_speedup_ci_low", pa.float64()),
        ("best_speedup_ci_high", pa.float64()),
        ("accuracy_outcome", pa.string()),
        ("reviewed", pa.bool_()),
        ("suspicious", pa.int64()),
        ("n_messages", pa.int64()),
        ("n_tool_calls", pa.int64()),
        ("n_experiments", pa.int64()),
        ("total_prompt_tokens", pa.int64()),
        ("total_completion_tokens", pa.int64()),
        ("total_cost_usd", pa.float64()),
    ]
)
SFT_SCHEMA = pa.schema(
    [
        ("messages", pa.list_(_MESSAGE)),
        ("tools_json", pa.string()),
        (
            "metadata",
            pa.struct(
                [
                    ("session_id", pa.string()),
                    ("task", pa.string()),
                    ("reward", pa.float64()),
                    ("verdicts", pa.list_(pa.string())),
                    ("reviewed", pa.bool_()),
                    ("best_speedup", pa.float64()),
                ]
            ),
        ),
    ]
)
RL_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("task", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("completion", pa.list_(_MESSAGE)),
        ("tools_json", pa.string()),
        ("reward", pa.float64()),
        ("reward_components", _COMPONENTS),
        ("reward_weights", _COMPONENTS),
        ("metrics", _RL_METRICS),
        ("verdicts", pa.list_(pa.string())),
        (
            "proposals",
            pa.list_(
                pa.struct(
                    [
                        ("proposal_id", pa.string()),
                        ("patch_id", pa.string()),
                        ("status", pa.string()),
                        ("reward", pa.float64()),
                        ("reward_components", _COMPONENTS),
                    ]
                )
            ),
        ),
    ]
)
ATIF_SCHEMA = pa.schema(
    [
        ("schema_version", pa.string()),
        ("session_id", pa.string()),
        ("task", pa.string()),
        ("created_at", pa.string()),
        ("reward", pa.float64()),
        ("total_steps", pa.int64()),
        ("notes", pa.string()),
        *[(f"{k}_json", pa.string()) for k in ATIF_JSON_COLUMNS],
    ]
)
ARROW_SCHEMAS: dict[ExportFormat, pa.Schema] = {
    ExportFormat.OPENAI_SFT: SFT_SCHEMA,
    ExportFormat.RL: RL_SCHEMA,
    ExportFormat.ATIF: ATIF_SCHEMA,
}
ROW_MODELS: dict[ExportFormat, type[BaseModel]] = {
    ExportFormat.OPENAI_SFT: SftRow,
    ExportFormat.RL: RlRow,
    ExportFormat.ATIF: Trajectory,
}
JSON_TEXT_COLUMNS: dict[ExportFormat, tuple[str, ...]] = {
    ExportFormat.OPENAI_SFT: ("tools",),
    ExportFormat.RL: ("tools",),
    ExportFormat.ATIF: (),
}
"""Row fields written to Parquet as JSON text, in a column named `<field>_json`."""
