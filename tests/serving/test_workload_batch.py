"""The load generator sends a batch job's prompts as one native request (`LoadSpec.batch_size`)
and keeps one record per prompt, routed by each chunk's `index`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from support import loopback_server

from infra_agent.serving.load.datasets import random_sessions
from infra_agent.serving.load.generator import LoadSpec, run_workload

BODIES: list[dict] = []


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """SGLang's native stream for a batch: cumulative chunks, interleaved across the prompts, each
    naming its prompt by `index` (prompt i answers i + 2 tokens, counting from its first id)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))  # fmt: skip
    body = json.loads(await reader.readexactly(length))
    BODIES.append(body)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
    prompts = body["input_ids"]
    for step in range(len(prompts) + 2):
        for i, prompt in enumerate(prompts):
            if step >= i + 2:
                continue
            ids = [prompt[0] + k for k in range(step + 1)]
            chunk = {"text": "x" * (step + 1), "output_ids": ids, "index": i,
                     "meta_info": {"completion_tokens": step + 1, "prompt_tokens": len(prompt)}}  # fmt: skip
            piece = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.002)
    done = b"data: [DONE]\n\n"
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
    await writer.drain()
    writer.close()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with loopback_server(_handle) as address:
        yield address


def test_a_batch_request_carries_its_prompts_and_each_prompt_keeps_its_record(url: str) -> None:
    BODIES.clear()
    sessions = random_sessions(7, 8, 4, vocab_size=64, range_ratio=0.0, seed=3)
    result = run_workload(url, sessions, LoadSpec(seed=5, batch_size=3))
    assert [len(b["input_ids"]) for b in sorted(BODIES, key=lambda b: len(b["input_ids"]))] == [
        1, 3, 3]  # fmt: skip
    by_session = {r.session: r for r in result.records}
    assert sorted(by_session) == list(range(7)) and all(r.success for r in result.records)
    for r in result.records:
        k = r.session % 3
        first = sessions[r.session].turns[0].new_ids[0]
        assert r.output_ids == [first + j for j in range(k + 2)] and r.output_tokens == k + 2
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.latency_s
    # Each prompt keeps the sampling seed it has when sent alone.
    sent = {tuple(p): sp["sampling_seed"] for b in BODIES
            for p, sp in zip(b["input_ids"], b["sampling_params"], strict=True)}  # fmt: skip
    for i, s in enumerate(sessions):
        assert sent[tuple(s.turns[0].new_ids)] == 5 * 100003 + i * 101


def test_only_single_turn_id_prompts_go_as_a_batch(url: str) -> None:
    sessions = random_sessions(2, 8, 4, vocab_size=64, range_ratio=0.0, seed=3)
    with pytest.raises(ValueError, match="native API"):
        run_workload(url, sessions, LoadSpec(api="completions", batch_size=2))
