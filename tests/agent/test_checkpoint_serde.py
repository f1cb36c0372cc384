"""The checkpoint serializer redacts the graph's state and leaves LangGraph's bookkeeping alone."""

from __future__ import annotations

from langgraph.types import Interrupt

from infra_agent.agent.checkpoint_serde import RedactingSerializer
from infra_agent.agent.runner import _STATE_TYPES
from infra_agent.agent.state import Message
from infra_agent.store.records import ToolCall

KEY = "sk-proj-" + "Ab3" * 8
VERSION = "00000000000000000000000000000002.0.8400946208955862"


def test_checkpoint_state_is_redacted_and_versions_kept() -> None:
    serde = RedactingSerializer(allowed_msgpack_modules=_STATE_TYPES)
    message = Message(
        role="assistant",
        content=f"use {KEY}",
        reasoning_content=f"the key is {KEY}",
        tool_calls=[ToolCall(id="c1", name="read_file", arguments=f'{{"password": "{KEY}"}}')],
    )
    checkpoint = {
        "v": 4,
        "id": "1f1ed9f1-05cf-6c31-bfff-e0fb15dbbea5",
        "channel_values": {"messages": [message], "patches": ["a" * 64], "review": {"p": "ok"}},
        "channel_versions": {"messages": VERSION},
        "versions_seen": {"propose": {"messages": VERSION}},
    }
    kind, data = serde.dumps_typed(checkpoint)
    assert KEY.encode() not in data
    back = serde.loads_typed((kind, data))
    [stored] = back["channel_values"]["messages"]
    assert stored.content == "use [REDACTED]" and "[REDACTED]" in stored.tool_calls[0].arguments
    assert stored.reasoning_content == "the key is [REDACTED]"
    assert back["channel_values"]["patches"] == ["a" * 64]
    assert back["channel_versions"] == {"messages": VERSION}
    assert checkpoint["channel_values"]["messages"][0].content == f"use {KEY}"  # not mutated


def test_pending_writes_and_errors_are_redacted() -> None:
    serde = RedactingSerializer(allowed_msgpack_modules=_STATE_TYPES)
    for value in (
        [Message(role="tool", content=f"Authorization: Bearer {KEY}")],
        RuntimeError(f"request to https://user:{KEY}@api.example failed"),
        Interrupt(value={"note": f"token={KEY}"}),
    ):
        assert KEY.encode() not in serde.dumps_typed(value)[1]
