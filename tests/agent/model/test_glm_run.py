"""Whole runs of the llm policy in the glm dialect against the stand-in for the paid endpoint
(Z.ai-shaped, a real HTTP server on 127.0.0.1): every later request carries `tool_stream`, the
profile's thinking settings and every earlier turn's reasoning; reasoning and cached tokens are
recorded per step, priced, and shown by `runs show`; a resumed run keeps the reasoning it had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from paid_endpoint import PaidEndpointStandIn, Reply, Usage
from support import run_cli

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.runner import resume_run, start_run
from infra_agent.agent.state import Budget
from infra_agent.config import Settings, load_settings
from infra_agent.store import open_store

REASONING = [
    "R1: the task first; what is the objective and which files may change?",
    "R2: the description names attention.py as the hot path; read it.",
    "R3: nothing here I can prove in this budget; stop.",
]
REPLIES = [
    Reply(REASONING[0], calls=[("describe_task", "{}")], usage=Usage(3000, 200, 0, 150)),
    Reply(
        REASONING[1],
        content="reading the kernel",
        calls=[("read_file", '{"path": "attention.py"}')],
        usage=Usage(5000, 300, 2900, 250),
    ),
    Reply(REASONING[2], calls=[("finish", '{"summary": "nothing proven"}')], usage=Usage(9000, 90, 4800, 60)),
]  # fmt: skip
PROFILE = """
[llm]
profile = "glm-under-test"

[llm.profiles.glm-under-test]
base_url = "{url}"
model = "glm-5.3"
dialect = "glm"
thinking = true
preserved_thinking = true
reasoning_effort = "high"
input_cost_per_mtok = 1.40
cached_input_cost_per_mtok = 0.26
output_cost_per_mtok = 4.40
"""


def _settings(endpoint: PaidEndpointStandIn, tmp_path: Path) -> Settings:
    config = tmp_path / "infra-agent.toml"
    config.write_text(PROFILE.format(url=endpoint.url))
    return load_settings(config, overrides={"store.db": str(tmp_path / "runs.db")}, env={})


def _reasoning_sent(request: dict) -> list[str]:  # type: ignore[type-arg]
    return [m["reasoning_content"] for m in request["messages"] if "reasoning_content" in m]


def test_a_glm_run_sends_tool_stream_thinking_and_every_earlier_reasoning(
    paid_endpoint: PaidEndpointStandIn, quick_task: Path, tmp_path: Path
) -> None:
    paid_endpoint.queue = [("reply", r) for r in REPLIES]
    settings = _settings(paid_endpoint, tmp_path)
    config = RunConfig(task=str(quick_task), policy="llm", budget=Budget(experiments=1, turns=6))
    outcome = start_run(config, settings)
    assert outcome.status == "finished" and outcome.stop_reason == "the llm policy called finish"
    requests = paid_endpoint.requests
    assert len(requests) == 3
    for k, body in enumerate(requests):
        assert body["tool_stream"] is True and body["stream"] is True
        assert body["thinking"] == {"type": "enabled", "clear_thinking": False}
        assert body["reasoning_effort"] == "high" and body["tool_choice"] == "auto"
        assert "stream_options" not in body and "logprobs" not in body
        assert _reasoning_sent(body) == REASONING[:k]  # every earlier turn's, unmodified, in order
    # the read_file call (arguments in fragments) was answered with the file
    (call,) = [m for m in requests[2]["messages"] if m["role"] == "assistant"][-1]["tool_calls"]
    assert call["function"] == {"name": "read_file", "arguments": '{"path": "attention.py"}'}
    result = requests[2]["messages"][-1]
    assert result["tool_call_id"] == call["id"] and "attention.py" in result["content"]

    store = open_store(tmp_path / "runs.db")
    steps = [s for s in store.steps(outcome.run_id) if s.role == "assistant"]
    assert [s.reasoning_content for s in steps] == REASONING
    assert [(s.prompt_tokens, s.cached_prompt_tokens) for s in steps] == [
        (3000, 0), (5000, 2900), (9000, 4800),
    ]  # fmt: skip
    assert [(s.completion_tokens, s.reasoning_tokens) for s in steps] == [
        (200, 150), (300, 250), (90, 60),
    ]  # fmt: skip
    assert steps[1].cost_usd == pytest.approx((2100 * 1.40 + 2900 * 0.26 + 300 * 4.40) / 1e6)
    assert outcome.usage.cost_usd == pytest.approx(sum(s.cost_usd or 0 for s in steps))
    store.close()

    shown = run_cli("--db", str(tmp_path / "runs.db"), "runs", "show", outcome.run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    model_steps = [s for s in json.loads(shown.stdout)["steps"] if s["role"] == "assistant"]
    assert [s["cached_prompt_tokens"] for s in model_steps] == [0, 2900, 4800]
    assert [s["reasoning_tokens"] for s in model_steps] == [150, 250, 60]
    text = run_cli("--db", str(tmp_path / "runs.db"), "runs", "show", outcome.run_id).stdout
    assert "17,000 prompt (7,700 cached)" in text and "590 completion (460 reasoning)" in text

    # ATIF export: cached tokens in ATIF's own per-step field and total, reasoning in the step's extra
    out = tmp_path / "runs.atif.jsonl"
    done = run_cli(
        "--db", str(tmp_path / "runs.db"), "export", "--format", "atif", "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    (trajectory,) = [json.loads(line) for line in out.read_text().splitlines()]
    metrics = [s["metrics"] for s in trajectory["steps"] if s.get("source") == "agent"]
    metrics = [m for m in metrics if m is not None]
    assert [m["cached_tokens"] for m in metrics] == [0, 2900, 4800]
    assert [m["extra"]["reasoning_tokens"] for m in metrics] == [150, 250, 60]
    assert trajectory["final_metrics"]["total_cached_tokens"] == 7700


def test_a_resumed_glm_run_keeps_the_reasoning_it_had(
    paid_endpoint: PaidEndpointStandIn, quick_task: Path, tmp_path: Path
) -> None:
    paid_endpoint.queue = [("reply", r) for r in REPLIES]
    settings = _settings(paid_endpoint, tmp_path)
    config = RunConfig(task=str(quick_task), policy="llm", budget=Budget(experiments=1, turns=6))

    def interrupt_before_the_third_request(text: str) -> None:
        if text.startswith("asking") and len(paid_endpoint.requests) == 2:
            raise KeyboardInterrupt  # Ctrl-C

    with pytest.raises(KeyboardInterrupt):
        start_run(config, settings, on_event=interrupt_before_the_third_request)
    store = open_store(tmp_path / "runs.db")
    (run,) = store.list_runs()
    assert run.status.value == "interrupted"
    store.close()

    outcome = resume_run(run.id, settings)
    assert outcome.status == "finished" and len(paid_endpoint.requests) == 3
    resumed = paid_endpoint.requests[2]
    assert _reasoning_sent(resumed) == REASONING[:2]
    assert resumed["thinking"] == {"type": "enabled", "clear_thinking": False}
    # the resumed request continues the same conversation the interrupted run had
    before = paid_endpoint.requests[1]["messages"]
    assert resumed["messages"][: len(before)] == before


def test_returned_reasoning_counts_against_the_profiles_context(
    paid_endpoint: PaidEndpointStandIn, quick_task: Path, tmp_path: Path
) -> None:
    long = [r + " " + "because " * 3000 for r in REASONING]  # about 24,000 characters each
    paid_endpoint.queue = [
        ("reply", Reply(reasoning, calls=reply.calls, usage=reply.usage))
        for reasoning, reply in zip(long, REPLIES, strict=True)
    ]
    config_file = tmp_path / "infra-agent.toml"
    config_file.write_text(PROFILE.format(url=paid_endpoint.url) + "context_chars = 40000\n")
    settings = load_settings(config_file, overrides={"store.db": str(tmp_path / "runs.db")}, env={})
    config = RunConfig(task=str(quick_task), policy="llm", budget=Budget(experiments=1, turns=6))
    assert start_run(config, settings).status == "finished"
    third = paid_endpoint.requests[2]
    # two turns of reasoning do not fit in 40,000 characters: the older is dropped whole
    assert _reasoning_sent(third) == [long[1]]
    assert sum(len(m["content"]) for m in third["messages"]) + len(long[1]) <= 40_000
