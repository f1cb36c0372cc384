"""The checkpoint serializer: LangGraph's own, with every string redacted before it is written.

A checkpoint holds the whole conversation (model messages, tool calls and results), which can
carry an API key a tool echoed or a password a model typed. `SqliteSaver` passes each checkpoint
and each pending write through its serializer's `dumps_typed`; this one redacts the strings of
the graph's state (`channel_values`, and every write) with the run store's rules first, so the
checkpoint file holds what the run store holds. A run resumed from it sees `[REDACTED]` where a
secret was: the model never needs the secret back, and the run store never had it.
Channel versions and the checkpoint's own ids are left as they are (the saver reads them).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from infra_agent.redact import Redactor, default_redactor


def redacted(value: Any, redactor: Redactor | None = None) -> Any:
    """A copy of `value` with every string in it redacted (pydantic records, dataclasses, dicts,
    lists, tuples and exceptions are walked; other values are returned as they are)."""
    r = redactor or default_redactor()
    if isinstance(value, str):
        return r.text(value)
    if isinstance(value, BaseModel):
        return type(value).model_validate_json(r.text(value.model_dump_json()))  # as the store
    if isinstance(value, dict):
        return {k: redacted(v, r) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [redacted(v, r) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: redacted(getattr(value, f.name), r) for f in dataclasses.fields(value)}
        try:
            return dataclasses.replace(value, **fields)
        except (TypeError, ValueError):  # init=False fields: redact a shallow copy instead
            clone = copy.copy(value)
            for name, field_value in fields.items():
                object.__setattr__(clone, name, field_value)
            return clone
    if isinstance(value, BaseException):  # a node's error, kept as a pending write
        error = copy.copy(value)
        error.args = tuple(redacted(a, r) for a in value.args)
        return error
    return value


class RedactingSerializer(JsonPlusSerializer):
    """`JsonPlusSerializer` that redacts the graph's state before serializing it."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if isinstance(obj, dict) and "channel_values" in obj:  # a checkpoint
            obj = {**obj, "channel_values": redacted(obj["channel_values"])}
        else:  # a pending write's value
            obj = redacted(obj)
        return super().dumps_typed(obj)
