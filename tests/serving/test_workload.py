"""The load generator against a stand-in SGLang stream (fast): per-request timing and tokens,
the client's own CPU time and event-loop lag, HTTP errors and broken streams."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from support import loopback_server

from infra_agent.serving.load.datasets import random_sessions
from infra_agent.serving.load.generator import LoadSpec, run_workload
from infra_agent.serving.load.stress import StressSpec, run_stress


def _chunk(i: int, claim: int = 1) -> bytes:
    """SGLang's native stream: cumulative text and ids, completion_tokens (times `claim`: a
    server inflating its count) in meta_info."""
    body = {"text": "ab " * (i + 1), "output_ids": list(range(i + 1)),
            "meta_info": {"completion_tokens": (i + 1) * claim, "prompt_tokens": 8,
                          "e2e_latency": 0.01}}  # fmt: skip
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))  # fmt: skip
    body = json.loads(await reader.readexactly(length))
    wanted = body["sampling_params"]["max_new_tokens"]
    if wanted == 13:  # an error response
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\n"
                     b"content-length: 4\r\n\r\noops")  # fmt: skip
        await writer.drain()
        writer.close()
        return
    # connection: close, as the stand-in closes after each answer: without it the client may
    # reuse a pooled connection the stand-in is closing, and that request fails (3 of 12 stress
    # probes once, at load 1-2)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
    for i in range(wanted if wanted != 11 else 3):  # 11: the stream breaks off early
        piece = _chunk(i, claim=4 if wanted == 9 else 1)  # 9: the count is inflated
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.002)
    if wanted == 11:
        writer.close()
        return
    done = b"data: [DONE]\n\n"
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with loopback_server(_handle) as address:
        yield address


def test_records_timing_tokens_and_the_clients_own_cost(url: str) -> None:
    sessions = random_sessions(24, 16, 12, vocab_size=64, range_ratio=0.0, seed=1)
    result = run_workload(url, sessions, LoadSpec(seed=1))
    assert len(result.records) == 24 and all(r.success for r in result.records)
    for r in result.records:
        assert r.output_tokens == 12 and r.output_ids == list(range(12))
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.latency_s
        assert len(r.itl_s) == 11 and r.meta["completion_tokens"] == 12
    assert result.client_cpu_s is not None and result.client_cpu_s > 0
    assert set(result.client_loop_lag_s) == {"p50", "p99"}
    assert 0 <= result.client_loop_lag_s["p50"] <= result.client_loop_lag_s["p99"]


def test_the_client_counts_the_tokens_it_received_not_the_servers_claim(url: str) -> None:
    sessions = random_sessions(3, 16, 9, vocab_size=64, range_ratio=0.0, seed=4)
    result = run_workload(url, sessions, LoadSpec(seed=4))
    for r in result.records:
        assert r.success and r.output_tokens == 9 and len(r.itl_s) == 8
        assert r.claimed_tokens == 36  # kept as the server's claim, for the judge to refuse
        assert r.prompt_ids is not None and len(r.prompt_ids) == r.prompt_tokens == 16


def test_http_errors_and_broken_streams_are_failed_requests(url: str) -> None:
    sessions = random_sessions(2, 16, 13, vocab_size=64, range_ratio=0.0, seed=2)
    sessions += random_sessions(2, 16, 11, vocab_size=64, range_ratio=0.0, seed=3)
    result = run_workload(url, sessions, LoadSpec(seed=2))
    assert not any(r.success for r in result.records)
    by_size = {r.session: r for r in result.records}
    assert [by_size[i].error[:8] for i in (0, 1)] == ["HTTP 500"] * 2
    # A stream that breaks off is a failed request (never a success with a short output).
    assert all(by_size[i].error and not by_size[i].success for i in (2, 3)), result.records


def test_stress_replays_a_probe_under_background_load_on_the_same_client(url: str) -> None:
    spec = StressSpec(repeats=12, probe_concurrency=3, background_concurrency=2, prompt_len=8,
                      output_len=10, background_input_len=8, background_output_len=6, vocab_size=64)  # fmt: skip
    report = run_stress(url, spec)
    assert report.completed == 12 and report.distinct_answers == 1
    assert report.background_requests >= 2
    # Identical answers: every anomaly is one the output health guard found.
    assert report.anomalies == report.unhealthy
