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
same value; `read_rows` reads either file back to the rows as written.
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
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


# -- Arrow -----------------------------------------------------------------------------------
def arrow_schema(model: type[BaseModel]) -> pa.Schema:
    """The Parquet schema of a row model: its fields in order, typed after their annotations."""
    return pa.schema([pa.field(name, arrow_type(f.annotation)) for name, f in model.model_fields.items()])  # fmt: skip


def arrow_type(annotation: Any) -> pa.DataType:
    """str, enums, literals and datetimes (as ISO text) are strings; int, float, bool; lists; a
    model is a struct; a dict, `Any` or a union of several types is JSON."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return arrow_type(kinds[0]) if len(kinds) == 1 else pa.json_()
    if origin is Literal or annotation in (str, datetime):
        return pa.string()
    if origin is list:
        return pa.list_(arrow_type(args[0]))
    if isinstance(annotation, type):
        if issubclass(annotation, Enum):
            return pa.string()
        if issubclass(annotation, BaseModel):
            return pa.struct([pa.field(n, arrow_type(f.annotation)) for n, f in annotation.model_fields.items()])  # fmt: skip
        simple = {bool: pa.bool_(), int: pa.int64(), float: pa.float64()}
        if annotation in simple:
            return simple[annotation]
    return pa.json_()


def json_text(value: Any) -> str:
    """`value` as compact JSON text (orjson; the standard library for what orjson refuses, like an
    integer beyond 64 bits)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@functools.cache
def _has_json(kind: pa.DataType) -> bool:
    if isinstance(kind, pa.JsonType):
        return True
    if pa.types.is_list(kind):
        return _has_json(kind.value_type)
    if pa.types.is_struct(kind):
        return any(_has_json(f.type) for f in kind)
    return False


def _storage(kind: pa.DataType) -> pa.DataType:
    """`kind` with JSON replaced by its storage (text), for building arrays from Python values."""
    if isinstance(kind, pa.JsonType):
        return pa.string()
    if pa.types.is_list(kind):
        return pa.list_(_storage(kind.value_type))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, _storage(f.type)) for f in kind])
    return kind


def _encoded(value: Any, kind: pa.DataType, cache: dict[int, Any]) -> Any:
    """`value` with each JSON-typed part as its JSON text (a list shared by many rows, like the
    tool specs, encoded once)."""
    if value is None or not _has_json(kind):
        return value
    if isinstance(kind, pa.JsonType):
        return json_text(value)
    if pa.types.is_list(kind):
        if id(value) not in cache:
            cache[id(value)] = (value, [_encoded(v, kind.value_type, cache) for v in value])
        return cache[id(value)][1]
    return {f.name: _encoded(value.get(f.name), f.type, cache) for f in kind}


def to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows as a table of `schema` (a NaN becomes null, as in JSON). Raises pa.ArrowInvalid /
    TypeError when a value does not fit its column's type."""
    cache: dict[int, Any] = {}  # id -> (the value, kept alive so that its id stays its own; text)
    columns = []
    for f in schema:
        values = [row[f.name] for row in rows]
        if _has_json(f.type):
            values = [_encoded(v, f.type, cache) for v in values]
        columns.append(pa.array(values, type=_storage(f.type), from_pandas=True).cast(f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _decoded(value: Any, kind: pa.DataType) -> Any:
    if value is None or not _has_json(kind):
        return value
    if isinstance(kind, pa.JsonType):
        return json.loads(value)
    if pa.types.is_list(kind):
        return [_decoded(v, kind.value_type) for v in value]
    return {f.name: _decoded(value[f.name], f.type) for f in kind}


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """A table's rows with its JSON columns decoded: the rows it was made of (`to_table`)."""
    rows = table.to_pylist()
    for f in table.schema:
        if _has_json(f.type):
            for row in rows:
                row[f.name] = _decoded(row[f.name], f.type)
    return rows


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an export file as they were written: JSON lines, or Parquet with its JSON
    columns decoded."""
    with path.open("rb") as f:
        parquet = f.read(4) == b"PAR1"
    if parquet:
        return table_rows(pq.read_table(path))
    return [json.loads(line) for line in path.read_text().splitlines()]
