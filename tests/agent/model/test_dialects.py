"""The model client per dialect against the stand-in for the paid endpoint (a real HTTP server
on 127.0.0.1): the request each dialect sends, tool-call fragments assembled, reasoning and
cached tokens read and priced, compaction counting reasoning, and bad profiles refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from paid_endpoint import PaidEndpointStandIn, Reply, Usage
from support import run_cli

from infra_agent.agent.configuration import resolve_policy
from infra_agent.agent.model.client import ChatClient
from infra_agent.agent.model.dialects import DIALECTS, detected, dialect_of
from infra_agent.agent.policies.llm import compact
from infra_agent.agent.state import Message
from infra_agent.config import LLMProfile, LLMSettings, load_settings
from infra_agent.errors import UserError
from infra_agent.store.records import ToolCall

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
GLM = {"thinking": True, "preserved_thinking": True, "reasoning_effort": "max"}

# An earlier exchange: the assistant thought, called a tool, and got its result.
HISTORY = [
    Message(role="system", content="s"),
    Message(role="user", content="task"),
    Message(
        role="assistant",
        content="",
        reasoning_content="R1: read the kernel first",
        tool_calls=[ToolCall(id="c1", name="read_file", arguments='{"path": "a.py"}')],
    ),
    Message(role="tool", content="def f(): ...", tool_call_id="c1", name="read_file"),
]


def _client(endpoint: PaidEndpointStandIn, dialect: str, **fields: Any) -> ChatClient:
    profile = LLMProfile(base_url=endpoint.url, dialect=dialect, max_retries=0, **fields)
    return ChatClient(profile, sleep=lambda s: None)


def _reply() -> Reply:
    return Reply(reasoning="R2: now patch it", calls=[("read_file", '{"path": "b.py"}')])


def test_glm_request_has_tool_stream_thinking_and_earlier_reasoning(
    paid_endpoint: PaidEndpointStandIn,
) -> None:
    paid_endpoint.queue = [("reply", _reply())]
    turn = _client(paid_endpoint, "glm", **GLM).complete(HISTORY, TOOLS)
    assert turn.message is not None and turn.errors == []
    (body,) = paid_endpoint.requests
    assert body["stream"] is True and body["tool_stream"] is True
    assert body["thinking"] == {"type": "enabled", "clear_thinking": False}
    assert body["reasoning_effort"] == "max" and body["tool_choice"] == "auto"
    assert "stream_options" not in body and "logprobs" not in body
    assistant = [m for m in body["messages"] if m["role"] == "assistant"]
    assert assistant[0]["reasoning_content"] == "R1: read the kernel first"
    assert all("reasoning_content" not in m for m in body["messages"] if m["role"] != "assistant")
    (result,) = [m for m in body["messages"] if m["role"] == "tool"]
    assert result == {"role": "tool", "content": "def f(): ...", "tool_call_id": "c1"}


def test_sglang_glm_request_passes_thinking_to_the_template(
    paid_endpoint: PaidEndpointStandIn,
) -> None:
    paid_endpoint.shape = "sglang"
    paid_endpoint.queue = [("reply", _reply())]
    _client(paid_endpoint, "glm-sglang", **GLM).complete(HISTORY, TOOLS)
    (body,) = paid_endpoint.requests
    assert body["chat_template_kwargs"] == {"enable_thinking": True, "clear_thinking": False}
    assert body["reasoning_effort"] == "max"
    assert body["stream_options"] == {"include_usage": True} and body["logprobs"] is True
    assert "tool_stream" not in body and "thinking" not in body
    assert [m.get("reasoning_content") for m in body["messages"] if m["role"] == "assistant"] == [
        "R1: read the kernel first"
    ]


def test_openai_request_is_unchanged(paid_endpoint: PaidEndpointStandIn) -> None:
    paid_endpoint.queue = [("reply", _reply())]
    _client(paid_endpoint, "openai").complete(HISTORY, TOOLS)
    (body,) = paid_endpoint.requests
    assert body["stream_options"] == {"include_usage": True} and body["logprobs"] is True
    assert not {"tool_stream", "thinking", "chat_template_kwargs", "reasoning_effort"} & set(body)
    assert all("reasoning_content" not in m for m in body["messages"])


def test_glm_never_sends_what_a_strict_front_end_refuses() -> None:
    """The openai dialect learns by failing once; the glm dialect never asks."""
    endpoint = PaidEndpointStandIn(refuse=("stream_options", "logprobs"))
    try:
        endpoint.queue = [("reply", _reply())]
        turn = _client(endpoint, "glm", **GLM).complete(HISTORY, TOOLS)
        assert turn.errors == [] and len(endpoint.requests) == 1
        endpoint.queue = [("reply", _reply())]
        turn = _client(endpoint, "openai").complete(HISTORY, TOOLS)
        assert [e.kind for e in turn.errors] == ["bad_request", "bad_request"]
        assert turn.message is not None and len(endpoint.requests) == 4
    finally:
        endpoint.close()


def test_tool_call_fragments_are_assembled(paid_endpoint: PaidEndpointStandIn) -> None:
    patch = json.dumps({"diff": "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n" * 20})
    reply = Reply(
        reasoning="think " * 50,
        content="two calls",
        calls=[("propose_patch", patch), ("read_file", '{"path": "attention.py"}')],
        pieces=9,
    )
    paid_endpoint.queue = [("reply", reply), ("reply", reply)]
    turn = _client(paid_endpoint, "glm", **GLM).complete(HISTORY, TOOLS)
    assert turn.message is not None
    assert [(c.name, c.arguments) for c in turn.message.tool_calls] == reply.calls
    assert len({c.id for c in turn.message.tool_calls}) == 2
    assert turn.message.reasoning_content == reply.reasoning
    assert turn.message.content == "two calls"
    fragments = [
        c for c in paid_endpoint.sent[0] for d in c["choices"] for _ in d["delta"].get("tool_calls", [])
    ]  # fmt: skip
    assert len(fragments) >= 2 * 9  # streamed in pieces because the request asked for tool_stream
    # Without tool_stream the stand-in (like Z.ai) sends each call whole; the result is the same.
    turn = _client(paid_endpoint, "openai").complete(HISTORY, TOOLS)
    assert turn.message is not None
    assert [(c.name, c.arguments) for c in turn.message.tool_calls] == reply.calls


@pytest.mark.parametrize("shape", ["zai", "sglang"])
def test_reasoning_and_cached_tokens_are_read_and_priced(shape: str) -> None:
    endpoint = PaidEndpointStandIn(shape=shape)  # type: ignore[arg-type]
    try:
        usage = Usage(prompt=10_000, completion=500, cached=8_000, reasoning=300)
        endpoint.queue = [("reply", Reply(reasoning="r", calls=[("finish", "{}")], usage=usage))]
        prices = {
            "input_cost_per_mtok": 1.40,
            "cached_input_cost_per_mtok": 0.26,
            "output_cost_per_mtok": 4.40,
        }
        dialect = "glm" if shape == "zai" else "glm-sglang"
        turn = _client(endpoint, dialect, **prices).complete(HISTORY, TOOLS)
        assert (turn.prompt_tokens, turn.cached_prompt_tokens) == (10_000, 8_000)
        assert (turn.completion_tokens, turn.reasoning_tokens) == (500, 300)
        assert turn.cost_usd == pytest.approx((2_000 * 1.40 + 8_000 * 0.26 + 500 * 4.40) / 1e6)
        # Without a cached-input price, cached tokens cost what other prompt tokens cost.
        endpoint.queue = [("reply", Reply(calls=[("finish", "{}")], usage=usage))]
        prices.pop("cached_input_cost_per_mtok")
        turn = _client(endpoint, dialect, **prices).complete(HISTORY, TOOLS)
        assert turn.cost_usd == pytest.approx((10_000 * 1.40 + 500 * 4.40) / 1e6)
        # An endpoint that reports neither leaves them unknown, not zero.
        endpoint.queue = [("reply", Reply(calls=[("finish", "{}")], usage=Usage()))]
        turn = _client(endpoint, dialect).complete(HISTORY, TOOLS)
        assert turn.cached_prompt_tokens is None and turn.reasoning_tokens is None
    finally:
        endpoint.close()


def test_compaction_counts_reasoning_and_drops_it_whole() -> None:
    long = "x" * 4000
    messages = [Message(role="system", content="s"), Message(role="user", content="task")]
    for i in range(10):
        messages.append(Message(role="assistant", content="", reasoning_content=f"{i}:" + long))
        messages.append(Message(role="tool", content="ok", tool_call_id=str(i), name="read_file"))
    assert compact(messages, 30_000) == messages  # content alone fits
    out = compact(messages, 30_000, reasoning=True)
    kept = [m.reasoning_content for m in out if m.role == "assistant"]
    assert sum(len(m.content) + len(m.reasoning_content or "") for m in out) <= 30_000
    assert kept[0] is None and kept[-1] == "9:" + long  # oldest dropped, newest kept
    assert all(r is None or r.endswith(long) for r in kept)  # never cut


def test_glm_is_detected_for_zai_and_bigmodel_hosts() -> None:
    assert detected("https://api.z.ai/api/paas/v4") == "glm"
    assert detected("https://api.z.ai/api/coding/paas/v4") == "glm"
    assert detected("https://open.bigmodel.cn/api/paas/v4/") == "glm"
    assert detected("http://127.0.0.1:30000/v1") == "openai"
    assert detected("https://notz.ai/v1") == "openai"
    assert detected("https://z.ai.example.com/v1") == "openai"
    assert detected(None) == "openai"
    assert dialect_of(LLMProfile(base_url="https://api.z.ai/api/paas/v4")).name == "glm"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"dialect": "claude"}, "dialect 'claude' is not one of openai, glm, glm-sglang"),
        ({"dialect": "glm", "tool_choice": "required"}, "takes tool_choice 'auto' only"),
        ({"dialect": "openai", "thinking": True}, "GLM settings the openai dialect does not"),
        ({"dialect": "glm", "thinking": False, "preserved_thinking": True}, "needs thinking"),
    ],
)
def test_bad_profiles_are_refused_before_a_run(fields: dict[str, Any], message: str) -> None:
    llm = LLMSettings(profile="p", profiles={"p": LLMProfile(base_url="http://x/v1", **fields)})
    with pytest.raises(UserError, match=message):
        resolve_policy("llm", llm, None)


def test_builtin_profiles() -> None:
    llm = load_settings(env={}).llm
    assert {"zai-glm-5.3", "zai-glm-5.3-flash", "sglang-glm"} <= set(llm.profiles)
    for name in ("zai-glm-5.3", "zai-glm-5.3-flash"):
        profile = llm.profiles[name]
        assert dialect_of(profile).name == "glm" and profile.api_key_env == "ZAI_API_KEY"
        assert profile.cached_input_cost_per_mtok is not None
    assert dialect_of(llm.profiles["sglang-glm"]).name == "glm-sglang"
    assert set(DIALECTS) == {"openai", "glm", "glm-sglang"}
    choice, reason = resolve_policy("auto", LLMSettings(profile="zai-glm-5.3"), None)
    assert choice == "llm" and "glm-5.3" in reason and "(glm dialect)" in reason
    # A profile of the same name in the file replaces the built-in one.
    own = LLMSettings(profiles={"zai-glm-5.3": LLMProfile(base_url="http://mine/v1")})
    assert own.profiles["zai-glm-5.3"].base_url == "http://mine/v1"


def test_config_profiles_lists_dialects_and_problems(tmp_path: Path) -> None:
    (tmp_path / "infra-agent.toml").write_text(
        '[llm]\nprofile = "mine"\n[llm.profiles.mine]\nbase_url = "https://open.bigmodel.cn/api/paas/v4"\n'
        '[llm.profiles.broken]\nbase_url = "http://x/v1"\ndialect = "glm"\ntool_choice = "required"\n'
    )
    done = run_cli("config", "profiles", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    views = {v["name"]: v for v in json.loads(done.stdout)}
    assert views["mine"]["dialect"] == "glm" and views["mine"]["active"]  # detected from the URL
    assert views["broken"]["dialect"] is None and "tool_choice" in views["broken"]["problem"]
    assert views["zai-glm-5.3"]["builtin"] and views["zai-glm-5.3"]["dialect"] == "glm"
    text = run_cli("config", "profiles", cwd=tmp_path).stdout
    assert "--reasoning-parser glm45 --tool-call-parser glm47" in text
