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
    """Up to ~65 s on a loaded 2-core machine (38-63 s in suite runs): one subprocess in SGLang's
    own environment imports SGLang's request model, parsers and chat rendering (no server), the
    only way to check our request against the version we pin."""
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


# The tiny model's tokenizer has no chat template; this one renders messages, returned
# reasoning and tool schemas the way GLM's does (reasoning in <think> blocks).
GLM_LIKE_TEMPLATE = (
    "{%- for m in messages -%}<|{{ m['role'] }}|>"
    "{%- if m['role'] == 'assistant' and m.get('reasoning_content') -%}"
    "<think>{{ m['reasoning_content'] }}</think>{%- endif -%}{{ m['content'] }}\n{% endfor -%}"
    "{%- if tools %}<|tools|>{{ tools | tojson }}\n{% endif -%}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif -%}"
)


@pytest.mark.slow
def test_a_glm_sglang_run_against_a_real_sglang_server(tmp_path: Path) -> None:
    """SGLang 0.5.23 on the CPU (tiny random-weight model) with GLM's parser flags and
    --enable-cache-report, driven by the llm policy in the glm-sglang dialect: every request is
    accepted (returned reasoning included), and the usage SGLang reports lands in the run's steps:
    later turns share the conversation's prefix, so SGLang's radix cache serves part of their
    prompt and the steps record it as cached prompt tokens. (Measured here: 3 replies of 48
    tokens, all reasoning; 1, 1707 and 1921 of 4551, 4765 and 2576 prompt tokens cached; the
    third is the last reply the used-up turn budget leaves, offered only finish.) Its own server
    (~60 s at load 8): GLM's parser flags, a GLM-like chat template and the cache report are
    start-up flags no other test's server has."""
    from infra_agent.serving.env import find_sglang_env

    if find_sglang_env() is None:
        pytest.skip("the SGLang environment is not set up (make setup)")
    import openai

    from infra_agent.agent.configuration import RunConfig
    from infra_agent.agent.runner import start_run
    from infra_agent.agent.state import Budget
    from infra_agent.config import load_settings
    from infra_agent.serving.deployment import load_deployment
    from infra_agent.serving.server import Server
    from infra_agent.store import open_store
    from infra_agent.tasks.registry import find_task

    template = tmp_path / "chat.jinja"
    template.write_text(GLM_LIKE_TEMPLATE)
    flags = dict(zip(*[iter(SGLANG_GLM_FLAGS["GLM-4.7, GLM-5.x"].split())] * 2, strict=True))
    knobs: dict[str, Any] = {k.lstrip("-"): v for k, v in flags.items()}
    knobs.update({"chat-template": str(template), "enable-cache-report": True})
    spec = load_deployment(find_task("sglang-cpu-tiny").root / "deployment.toml")
    with Server.start(spec, tmp_path / "server", knobs=knobs) as server:
        model = openai.OpenAI(base_url=server.url + "/v1", api_key="none").models.list().data[0].id
        db = tmp_path / "runs.db"
        settings = load_settings(
            overrides={
                "store.db": str(db),
                "llm.profile": "glm",
                "llm.profiles.glm.base_url": server.url + "/v1",
                "llm.profiles.glm.model": model,
                "llm.profiles.glm.dialect": "glm-sglang",
                "llm.profiles.glm.thinking": True,
                "llm.profiles.glm.preserved_thinking": True,
                "llm.profiles.glm.reasoning_effort": "high",
                "llm.profiles.glm.max_tokens": 48,
                "llm.profiles.glm.timeout_s": 120,
            },
            env={},
        )
        config = RunConfig(  # a small prompt: the tiny model's context is 8192 tokens
            task="example-matmul",
            policy="llm",
            feedback="sparse",
            budget=Budget(experiments=1, turns=2, wall_s=600),  # 2 replies, then the last one
        )
        outcome = start_run(config, settings)
    assert outcome.status == "finished", outcome
    store = open_store(db)
    steps = store.steps(outcome.run_id)
    replies = [s for s in steps if s.role == "assistant"]
    errors = [s.error for s in steps if s.name == "model"]
    assert len(replies) == 3, errors  # no request was refused
    assert all(s.completion_tokens and s.logprobs for s in replies)
    cached = [s.cached_prompt_tokens for s in replies]
    assert all(c is not None for c in cached) and cached[1] and cached[2], cached
    # GLM's reasoning parser puts the reply in reasoning_content (the template opened no answer),
    # which went back with the next requests; SGLang counts those tokens as reasoning
    assert all(s.reasoning_content for s in replies)
    assert all(0 < (s.reasoning_tokens or 0) <= (s.completion_tokens or 0) for s in replies)
