"""Fast tests of the serving pieces that need no server: datasets, metrics, knob checks, the tiny
model files (the accuracy judge's statistics: test_judge_units.py)."""

import json
from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.serving.knobs import CATALOGUE, check_device, check_flags, task_knobs
from infra_agent.serving.load.datasets import (
    coding_agent_sessions,
    random_sessions,
    replay_sessions,
)
from infra_agent.serving.load.generator import LoadSpec, RequestRecord, WorkloadResult
from infra_agent.serving.load.metrics import SLO, summarize
from infra_agent.serving.tiny_model import VOCAB_SIZE, train_tokenizer, write_tiny_model
from infra_agent.tasks.registry import find_task


def test_random_sessions_are_seeded_and_in_range() -> None:
    a = random_sessions(20, 64, 32, vocab_size=100, seed=1)
    assert a == random_sessions(20, 64, 32, vocab_size=100, seed=1)
    assert a != random_sessions(20, 64, 32, vocab_size=100, seed=2)
    for s in a:
        (turn,) = s.turns
        assert 32 <= len(turn.new_ids) <= 64 and 16 <= turn.output_len <= 32
        assert all(3 <= i < 100 for i in turn.new_ids)


def test_coding_agent_sessions_share_a_prefix() -> None:
    sessions = coding_agent_sessions(
        4, vocab_size=500, shared_prefix_len=100, context_len=20, turns=3
    )
    firsts = [s.turns[0].new_ids for s in sessions]
    assert all(f[:100] == firsts[0][:100] for f in firsts)
    assert firsts[0][100:120] != firsts[1][100:120]
    assert all(len(s.turns) == 3 for s in sessions)


def test_replay_log(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    rows = [
        {"session": "a", "input_ids": [5, 6], "output_len": 4},
        {"session": "b", "text": "hi", "output_len": 2},
        {"session": "a", "input_ids": [7], "output_len": 3, "delay_s": 0.1},
    ]
    log.write_text("\n".join(json.dumps(r) for r in rows))
    sessions = replay_sessions(log)
    assert [len(s.turns) for s in sessions] == [2, 1]
    assert sessions[0].turns[1].delay_s == 0.1 and sessions[1].turns[0].text == "hi"
    log.write_text('{"input_ids": [1]}\n')
    with pytest.raises(UserError, match="log.jsonl:1"):
        replay_sessions(log)


def record(ttft: float, latency: float, tokens: int, ok: bool = True) -> RequestRecord:
    return RequestRecord(
        session=0, turn=0, success=ok, prompt_tokens=10, output_tokens=tokens, ttft_s=ttft,
        latency_s=latency, itl_s=[(latency - ttft) / max(tokens - 1, 1)] * (tokens - 1),
    )  # fmt: skip


def test_metrics_throughput_percentiles_goodput() -> None:
    records = [
        record(0.1, 1.1, 11),
        record(0.2, 2.2, 11),
        record(3.0, 4.0, 11),
        record(0, 0, 0, ok=False),
    ]
    m = summarize(
        WorkloadResult(records=records, duration_s=2.0, load=LoadSpec()),
        SLO(ttft_ms=1000, tpot_ms=150),
    )
    assert m.output_throughput == pytest.approx(33 / 2.0)
    assert m.total_throughput == pytest.approx((33 + 30) / 2.0)
    assert m.completed == 3 and m.failed == 1
    # Request 2 breaks the TPOT SLO (200 ms/token), request 3 the TTFT SLO.
    assert m.goodput == pytest.approx(1 / 2.0)
    assert m.ttft_ms["p50"] == pytest.approx(200.0)
    assert m.sample()["output_throughput"] == m.output_throughput
    assert "output tok/s" in m.render()
    assert "output_tokens_per_cpu_s" not in m.sample()  # nobody read the server's CPU time
    # With the server's CPU seconds: output tokens per CPU-second beside the throughput.
    timed = WorkloadResult(records=records, duration_s=2.0, load=LoadSpec(), server_cpu_s=1.5,
                           client_cpu_s=0.25)  # fmt: skip
    sample = summarize(timed).sample()
    assert sample["output_tokens_per_cpu_s"] == pytest.approx(33 / 1.5)
    assert sample["server_cpu_s"] == 1.5 and sample["client_cpu_s"] == 0.25
    assert "per server CPU-s" in summarize(timed).render()


def test_knob_checks() -> None:
    flags = {"chunked-prefill-size": None, "schedule-policy": ["lpm", "fcfs"]}
    check_flags({"chunked-prefill-size": 64, "schedule-policy": "lpm"}, flags=flags)
    with pytest.raises(UserError, match="not one of lpm, fcfs"):
        check_flags({"schedule-policy": "dfs"}, flags=flags)
    with pytest.raises(UserError, match="--no-such-knob"):
        check_flags({"no-such-knob": 1}, flags=flags)
    check_device({"attention-backend": "flashinfer"}, CATALOGUE, gpu=False)  # default: fine
    with pytest.raises(UserError, match="enable-hierarchical-cache needs a GPU"):
        check_device({"enable-hierarchical-cache": True}, CATALOGUE, gpu=False)
    check_device({"enable-hierarchical-cache": True}, CATALOGUE, gpu=True)
    assert (
        task_knobs(["max-running-requests"], max_running_requests=8)["max-running-requests"].default
        == 8
    )


def test_bundled_task_knobs_come_from_the_catalogue() -> None:
    task = find_task("sglang-cpu-tiny")
    assert task.manifest.kind == "serving"
    for name, knob in task.manifest.knobs.items():
        ref = CATALOGUE[name]
        assert (knob.type, knob.choices, knob.min, knob.max, knob.needs_gpu) == (
            ref.type, ref.choices, ref.min, ref.max, ref.needs_gpu,
        )  # fmt: skip


def test_tiny_model_files(tmp_path: Path) -> None:
    folder = write_tiny_model(tmp_path / "m", seed=0)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == VOCAB_SIZE
    raw = (folder / "model.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    assert header["lm_head.weight"]["shape"] == [VOCAB_SIZE, config["hidden_size"]]
    tok = train_tokenizer(0)
    text = tok.decode(list(range(3, VOCAB_SIZE)))
    assert text.isascii()  # random tokens decode to clean text
    assert write_tiny_model(tmp_path / "m", seed=0) == folder  # idempotent


def test_file_view_shows_the_paths_a_command_names(tmp_path: Path) -> None:
    """The paths a server's command names are what its confined view shows read-only (the
    binds themselves are built by sandboxes.confinement, tested with the sandboxes)."""
    from infra_agent.sandboxes.fileview import FileView, paths_named

    venv = tmp_path / "env"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin" / "python").touch()
    model = tmp_path / "work" / "models" / "tiny"
    model.mkdir(parents=True)
    argv = [str(venv / "bin" / "python"), "-m", "x", "--model-path", str(model),
            f"--config={tmp_path / 'missing.json'}", "--tokenizer=" + str(model)]  # fmt: skip
    assert paths_named(argv) == [venv, model, model]  # the interpreter stands for its venv
    view = FileView(mode="confined", shown=[str(venv), str(model)], writable=str(tmp_path))
    assert "and 2 paths read-only" in view.render()
    assert FileView(mode="host", reason="no bwrap").render() == "host (unconfined: no bwrap)"
