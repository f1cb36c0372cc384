"""The glm-sglang dialect checked against SGLang 0.5.23 itself (its own environment, no server):
every field of the request is one SGLang's request model knows, a malformed earlier call does not
make SGLang refuse the request, the reasoning returned with
earlier assistant turns reaches GLM-5.3's prompt (all of it with preserved thinking, only the
current user turn's without), and the recommended parser flags name real SGLang parsers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra_agent.agent.model.dialects import DIALECTS, SGLANG_GLM_FLAGS
from infra_agent.agent.state import Message
from infra_agent.config import LLMProfile
from infra_agent.store.records import ToolCall

pytestmark = pytest.mark.sglang

PROBE = Path(__file__).with_name("sglang_glm_probe.py")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


def _turn(reasoning: str, path: str, call_id: str) -> list[Message]:
    call = ToolCall(id=call_id, name="read_file", arguments=json.dumps({"path": path}))
    return [
        Message(role="assistant", content="", reasoning_content=reasoning, tool_calls=[call]),
        Message(role="tool", content=f"contents of {path}", tool_call_id=call_id, name="read_file"),
    ]


CONVERSATION = [
    Message(role="system", content="You optimize serving systems."),
    Message(role="user", content="Make decode faster."),
    *_turn("FIRST-THOUGHT: look at the kernel", "attention.py", "c1"),
    Message(
        role="assistant",
        content="",
        reasoning_content="a call cut short",
        tool_calls=[ToolCall(id="c9", name="read_file", arguments='{"path": "attention.py"')],
    ),
    Message(role="tool", content="error: arguments are not valid JSON", tool_call_id="c9"),
    Message(role="user", content="error: your reply called no tool."),
    *_turn("SECOND-THOUGHT: now the server loop", "decode_server.py", "c2"),
]


def _probe() -> dict[str, Any]:
    """What SGLang makes of the conversation sent with and without preserved thinking."""
    from infra_agent.serving.env import env_python, find_sglang_env

    env = find_sglang_env()
    if env is None:
        pytest.skip("the SGLang environment is not set up (make setup)")
    bodies = [
        DIALECTS["glm-sglang"].request(
            LLMProfile(thinking=True, preserved_thinking=keep, reasoning_effort="high"),
            CONVERSATION,
            TOOLS,
        )
        for keep in (True, False)
    ]
    done = subprocess.run(
        [str(env_python(env)), str(PROBE)],
        input=json.dumps({"bodies": bodies, "flags": list(SGLANG_GLM_FLAGS.values())}),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sglang_takes_the_glm_request_and_renders_its_reasoning() -> None:
    result = _probe()
    assert result["unknown_parsers"] == []
    preserved, interleaved = result["bodies"]
    assert preserved["ignored"] == []  # SGLang knows every field we send
    assert preserved["reasoning"] == [
        "FIRST-THOUGHT: look at the kernel", "a call cut short", "SECOND-THOUGHT: now the server loop",
    ]  # fmt: skip
    prompt = preserved["prompt"]
    assert "Reasoning Effort: High" in prompt
    assert "<think>FIRST-THOUGHT: look at the kernel</think>" in prompt
    assert prompt.index("FIRST-THOUGHT") < prompt.index("<think>SECOND-THOUGHT")
    # Without preserved thinking the template keeps only the current user turn's reasoning.
    prompt = interleaved["prompt"]
    assert "FIRST-THOUGHT" not in prompt and "<think>SECOND-THOUGHT" in prompt
