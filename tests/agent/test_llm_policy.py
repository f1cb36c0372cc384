"""The llm policy's transport against a fake OpenAI-compatible endpoint on 127.0.0.1: streaming,
reasoning_content, logprobs, retries on 429/5xx, timeouts; and a whole run driven by bad replies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.policies.llm import OpenAIChatModel, compact
from infra_agent.agent.runner import start_run
from infra_agent.agent.state import Budget, Message
from infra_agent.config import LLMProfile, load_settings
from infra_agent.store import open_store


def test_rate_limit_and_server_error_are_retried_and_reported(fake_endpoint: Any) -> None:
    fake_endpoint.queue = [
        ("status", 429),
        ("status", 503),
        (
            "stream",
            fake_endpoint.tool_call_reply(
                "read_file", '{"path": "attention.py"}', content="look", reasoning="I should read"
            ),
        ),
    ]
    sleeps: list[float] = []
    model = OpenAIChatModel(
        LLMProfile(base_url=fake_endpoint.url, max_retries=3), sleep=sleeps.append
    )
    turn = model.complete([{"role": "user", "content": "go"}], [])
    assert [e.kind for e in turn.errors] == ["rate_limit", "server_error"]
    assert sleeps == [0.0, 0.0]  # the server's Retry-After: 0 wins over the backoff
    assert turn.message is not None and turn.streamed
    call = turn.message.tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("read_file", {"path": "attention.py"})
    assert turn.message.reasoning_content == "I should read" and turn.message.content == "look"
    assert turn.logprobs == [{"token": "x", "logprob": -0.5}]
    assert (turn.prompt_tokens, turn.completion_tokens) == (100, 7)
    assert (
        fake_endpoint.requests[-1]["stream"] is True
        and fake_endpoint.requests[-1]["logprobs"] is True
    )


def test_timeouts_end_in_a_failed_turn_not_an_exception(fake_endpoint: Any) -> None:
    fake_endpoint.queue = [("hang", None), ("hang", None)]
    model = OpenAIChatModel(
        LLMProfile(base_url=fake_endpoint.url, max_retries=1, timeout_s=0.3), sleep=lambda s: None
    )
    turn = model.complete([{"role": "user", "content": "go"}], [])
    assert turn.message is None
    assert [e.kind for e in turn.errors] == ["timeout", "timeout"]


def test_old_tool_results_are_compacted_first() -> None:
    messages = [Message(role="system", content="s"), Message(role="user", content="task")]
    messages += [
        Message(role="tool", content="x" * 5000, tool_call_id=str(i), name="read_file")
        for i in range(12)
    ]
    out = compact(messages, max_chars=20_000)
    assert sum(len(m.content) for m in out) <= 20_000
    assert "[compacted" in out[2].content and out[-1].content == "x" * 5000
    assert out[0].content == "s" and out[1].content == "task"


def test_a_run_survives_malformed_calls_rate_limits_and_timeouts(
    fake_endpoint: Any, quick_task: Path, tmp_path: Path
) -> None:
    fake_endpoint.queue = [
        (
            "stream",
            [fake_endpoint.chunk({"role": "assistant", "content": "I think the answer is 42."})],
        ),  # no tool call
        (
            "stream",
            fake_endpoint.tool_call_reply("read_file", '{"path": "attention.py"'),
        ),  # bad JSON
        ("stream", fake_endpoint.tool_call_reply("launch_missiles", "{}")),  # unknown tool
        ("status", 429),
        (
            "stream",
            fake_endpoint.tool_call_reply(
                "propose_knobs", '{"knobs": {"num_splits": "many"}, "rationale": "x"}'
            ),
        ),
        ("hang", None),  # timeout, then a good call
        ("stream", fake_endpoint.tool_call_reply("describe_task", "{}", reasoning="start over")),
        ("stream", fake_endpoint.tool_call_reply("finish", '{"summary": "nothing proven"}')),
    ]
    db = tmp_path / "runs.db"
    settings = load_settings(
        overrides={
            "store.db": str(db),
            "llm.endpoint.base_url": fake_endpoint.url,
            "llm.endpoint.model": "fake-glm",
            "llm.endpoint.timeout_s": 5.0,  # the hang times out; answers come in milliseconds
            "llm.endpoint.max_retries": 2,
        }
    )
    config = RunConfig(task=str(quick_task), policy="llm", budget=Budget(experiments=1, turns=10))
    outcome = start_run(config, settings)
    assert outcome.status == "finished" and outcome.stop_reason == "the llm policy called finish"
    assert outcome.experiments == [] and outcome.proposals == []
    store = open_store(db)
    steps = store.steps(outcome.run_id)
    errors = [s.error or "" for s in steps]
    assert any("called no tool" in e for e in errors)
    assert any("not valid JSON" in e for e in errors)
    assert any("unknown tool 'launch_missiles'" in e for e in errors)
    assert any("'num_splits'" in e for e in errors)
    assert any("RateLimitError" in e for e in errors)
    assert any("Timeout" in e for e in errors)
    assistant = [s for s in steps if s.role == "assistant"]
    assert len(assistant) == 6 and all(s.prompt_tokens == 100 for s in assistant)
    assert any(s.reasoning_content == "start over" for s in assistant)
    assert any(s.logprobs for s in assistant)
    run = store.get_run(outcome.run_id)
    assert run is not None and run.model == "fake-glm" and run.status.value == "finished"
    # reasoning is logged but never sent back to the model
    assert all("reasoning_content" not in m for r in fake_endpoint.requests for m in r["messages"])
