"""The load generator: an async client for SGLang's native `/generate` and OpenAI `/v1/completions`.

    result = run_workload(url, sessions, LoadSpec(api="generate", request_rate=8.0, seed=1))
    result.records[0].ttft_s, result.records[0].itl_s, result.records[0].meta

Sessions start as a Poisson process at `request_rate` (inf: all at once), capped by
`max_concurrency` requests in flight, until `duration_s` (then in-flight requests finish). Turns
of a session are sent in order, each prompt extending the last prompt and output (prefix-cache
reuse). With `batch_size` > 1, consecutive single-turn sessions go as one request whose prompts
are a list (a batch job's request), each prompt still its own record. Every request is streamed
and timed with this process's clock: TTFT, inter-token latencies, total latency, the server's
per-request meta (including `spec_accept_length` when speculative decoding is on). The client
counts: `output_tokens` is the number of token ids the stream carried (SGLang's `/generate`
streams them; `/v1/completions` requests carry `return_token_ids`), never the server's
`completion_tokens`, which stays in `meta` as the server's claim (`RequestRecord.claimed_tokens`)
for a judge to hold against what arrived. With `guard=True` the online health guard watches each
stream and aborts a request whose output trips it (the rule is recorded).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from typing import Any, Literal

import aiohttp
import orjson
from pydantic import BaseModel, Field

from infra_agent.feedback.health import StreamGuard
from infra_agent.judgement.describe import rank_percentiles
from infra_agent.serving.load.datasets import Session, Turn

LINE_LIMIT = 1 << 24
"""Longest line of a response stream the client reads, bytes."""


class LoadSpec(BaseModel):
    api: Literal["generate", "completions"] = "generate"
    request_rate: float = math.inf
    """Session arrivals per second (Poisson); inf sends all sessions at once."""
    max_concurrency: int | None = None
    """Most requests in flight at once (None: unlimited)."""
    duration_s: float | None = None
    """Stop starting sessions after this many seconds (None: run all sessions)."""
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = True
    """Generate exactly max_new_tokens (throughput runs must not depend on when EOS is drawn)."""
    seed: int = 0
    """Seeds arrivals and per-request sampling seeds."""
    timeout_s: float = 300.0
    """Per-request limit, seconds."""
    guard: bool = False
    """Abort a stream when the online health guard trips."""
    model: str = "default"
    """Model name sent to the OpenAI API."""
    return_logprob: bool = False
    """Ask for the log-probability of every output token (as RL and evaluation clients do)."""
    top_logprobs_num: int = 0
    """With return_logprob: also the top-N alternatives at each position."""
    return_text_in_logprobs: bool = False
    """With return_logprob (native API): each logprob entry carries its token's text."""
    logit_bias: dict[str, float] | None = None
    """Every request's logit_bias: token id (as a string, as the APIs take it) -> bias added to
    its logit (-100 bans it), as clients that ban or favour a list of tokens send."""
    stop: list[str] | None = None
    stop_regex: list[str] | None = None
    """Every request's stop strings and stop patterns (SGLang's `stop_regex`)."""
    batch_size: int = 1
    """Prompts per request (native API, single-turn sessions): consecutive sessions go as one
    streamed request whose `input_ids` and `sampling_params` are their lists, each chunk's `index`
    naming its prompt, as clients that send a job's prompts as one batch do. Each prompt keeps its
    own record; `request_rate` and `max_concurrency` count HTTP requests."""
    incremental: bool = False
    """The server streams increments (`--incremental-streaming-output`): every native chunk's
    ids are new tokens (else the client tells cumulative from incremental chunks by their
    prefix, which a delta that repeats the output's first tokens fools)."""


class RequestRecord(BaseModel):
    """One request as the client saw it (times in seconds, this process's monotonic clock)."""

    session: int
    turn: int
    success: bool
    prompt_tokens: int
    prompt_ids: list[int] | None = None
    """The prompt's token ids as sent (None for a text prompt)."""
    output_tokens: int = 0
    """Output tokens received: token ids the stream carried (text chunks where it carried none)."""
    start_s: float = 0.0
    """Send time relative to the start of the run."""
    latency_s: float = 0.0
    ttft_s: float | None = None
    itl_s: list[float] = Field(default_factory=list)
    """Gaps between successive chunks that carried new tokens."""
    text: str = ""
    output_ids: list[int] | None = None
    error: str = ""
    meta: dict[str, Any] = Field(default_factory=dict)
    """The server's meta_info (native API) or usage (OpenAI API)."""
    aborted_rule: str | None = None
    """Health rule that aborted the stream (guard=True)."""

    @property
    def claimed_tokens(self) -> int | None:
        """The output tokens the server said it generated (`completion_tokens`), if it said."""
        claim = self.meta.get("completion_tokens")
        return int(claim) if claim is not None else None


class WorkloadResult(BaseModel):
    records: list[RequestRecord]
    duration_s: float
    """From the first request sent to the last response finished."""
    load: LoadSpec
    client_cpu_s: float | None = None
    """CPU seconds this load generator's thread used (it shares the cores with the server)."""
    client_loop_lag_s: dict[str, float] = Field(default_factory=dict)
    """p50/p99 of how late the client's event loop woke (its timestamps are late by as much)."""
    server_cpu_s: float | None = None
    """CPU seconds the server's processes used during the run (set by whoever can read them)."""


def _payload(
    load: LoadSpec, prompt_ids: list[int], text: str | None, output_len: int, seed: int
) -> dict[str, Any]:
    if load.api == "generate":
        sampling: dict[str, Any] = {
            "max_new_tokens": output_len,
            "temperature": load.temperature,
            "top_p": load.top_p,
            "ignore_eos": load.ignore_eos,
            "sampling_seed": seed,
        }
        if load.logit_bias is not None:
            sampling["logit_bias"] = load.logit_bias
        sampling |= _stops(load)
        body: dict[str, Any] = {"sampling_params": sampling, "stream": True}
        body["text" if text is not None else "input_ids"] = text if text is not None else prompt_ids
        if load.return_logprob:
            body |= {
                "return_logprob": True,
                "top_logprobs_num": load.top_logprobs_num,
                "return_text_in_logprobs": load.return_text_in_logprobs,
            }
        return body
    body = {
        "model": load.model,
        "prompt": text if text is not None else prompt_ids,
        "max_tokens": output_len,
        "temperature": load.temperature,
        "top_p": load.top_p,
        "ignore_eos": load.ignore_eos,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
    }
    if load.return_logprob:
        body["logprobs"] = load.top_logprobs_num
    if load.logit_bias is not None:
        body["logit_bias"] = load.logit_bias
    return body | _stops(load)


def _stops(load: LoadSpec) -> dict[str, list[str]]:
    """The load's stop strings and patterns, by the name both APIs take them under."""
    return {k: v for k in ("stop", "stop_regex") if (v := getattr(load, k)) is not None}


async def _send(
    client: aiohttp.ClientSession,
    url: str,
    load: LoadSpec,
    record: RequestRecord | list[RequestRecord],
    body: dict[str, Any],
    t0: float,
) -> None:
    """Send one request carrying `record`'s prompt, or a batch's prompts whose chunks name their
    prompt by `index` (a list of records), and fold its stream into each record."""
    records = record if isinstance(record, list) else [record]
    path = "/generate" if load.api == "generate" else "/v1/completions"
    guards = [StreamGuard() if load.guard else None for _ in records]
    sent = time.monotonic()
    for record in records:
        record.start_s = sent - t0
    last = [sent] * len(records)
    tokens = [0] * len(records)
    try:
        async with client.post(url + path, json=body) as resp:
            if resp.status != 200:
                error = f"HTTP {resp.status}: {(await resp.read())[:300]!r}"
                for record in records:
                    record.error = error
                return
            async for line in resp.content:  # server-sent events, one line at a time
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = orjson.loads(data)
                if "error" in chunk:
                    for record in records:
                        record.error = str(chunk["error"])[:300]
                    return
                now = time.monotonic()
                i = int(chunk.get("index", 0)) if len(records) > 1 else 0
                record = records[i]
                seen = len(record.output_ids or [])
                new_tokens, delta = _absorb(load, record, chunk)
                if new_tokens > 0:
                    if tokens[i] == 0:
                        record.ttft_s = now - sent
                    else:
                        record.itl_s.append(now - last[i])
                    tokens[i] += new_tokens
                    last[i] = now
                guard = guards[i]
                if guard is not None:
                    issue = guard.feed(delta, (record.output_ids or [])[seen:], record.meta)
                    if issue is not None:
                        record.aborted_rule = issue.rule
                        break
        for record, count in zip(records, tokens, strict=True):
            ids = record.output_ids
            record.output_tokens = len(ids) if ids is not None else count
            record.success = not record.error and record.aborted_rule is None
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, ValueError, OSError) as exc:
        for record in records:
            record.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        end = time.monotonic()
        for i, record in enumerate(records):
            # A prompt of a batch is done at its last token (the stream ends with the slowest).
            record.latency_s = (last[i] if len(records) > 1 and tokens[i] else end) - sent


def _absorb(load: LoadSpec, record: RequestRecord, chunk: dict[str, Any]) -> tuple[int, str]:
    """Fold one stream chunk into the record; return (new tokens, new text)."""
    before = len(record.output_ids or [])
    if load.api == "generate":
        record.meta = chunk.get("meta_info") or {}
        text = chunk.get("text", "")
        # SGLang streams the cumulative text by default, increments with incremental streaming.
        delta = text[len(record.text) :] if text.startswith(record.text) else text
        record.text = text if text.startswith(record.text) else record.text + text
        ids = chunk.get("output_ids")
        if isinstance(ids, list):
            if load.incremental:
                record.output_ids = (record.output_ids or []) + ids
            elif (
                record.output_ids is None
                or len(ids) >= len(record.output_ids)
                and ids[: len(record.output_ids)] == record.output_ids
            ):
                record.output_ids = ids
            else:
                record.output_ids += ids
            return len(record.output_ids) - before, delta
        return (1 if delta else 0), delta
    if chunk.get("usage"):
        record.meta = dict(chunk["usage"])
    choices = chunk.get("choices") or []
    delta = choices[0].get("text", "") if choices else ""
    record.text += delta
    ids = choices[0].get("token_ids") if choices else None
    if isinstance(ids, list):  # incremental: this chunk's tokens
        record.output_ids = (record.output_ids or []) + [int(i) for i in ids]
        return len(record.output_ids) - before, delta
    return (1 if delta else 0), delta


async def _loop_lag(lags: list[float], period_s: float = 0.01) -> None:
    """How late this event loop wakes up (seconds past a `period_s` sleep), until cancelled: a
    chunk that arrives while the loop is busy is timestamped that late."""
    while True:
        started = time.monotonic()
        await asyncio.sleep(period_s)
        lags.append(time.monotonic() - started - period_s)


def _batches(load: LoadSpec, sessions: list[Session]) -> list[tuple[int, list[Session]]]:
    """`sessions` in consecutive groups of `load.batch_size`, each with its first index."""
    if load.api != "generate" or load.guard:
        raise ValueError("batched prompts go to the native API, without the stream guard")
    if any(len(s.turns) != 1 or s.turns[0].text is not None for s in sessions):
        raise ValueError("batched prompts are single-turn token-id prompts")
    n = load.batch_size
    return [(i, sessions[i : i + n]) for i in range(0, len(sessions), n)]


def _batch_request(
    load: LoadSpec, first: int, group: list[Session]
) -> tuple[list[RequestRecord], dict[str, Any]]:
    """The records of a batch's prompts (sessions `first`...) and the one native request carrying
    them: `input_ids` and `sampling_params` as lists, each prompt with the seed it has alone."""
    records, bodies = [], []
    for k, s in enumerate(group):
        ids, index = s.turns[0].new_ids, first + k
        records.append(RequestRecord(session=index, turn=0, success=False,
                                     prompt_tokens=len(ids), prompt_ids=ids))  # fmt: skip
        bodies.append(
            _payload(load, ids, None, s.turns[0].output_len, load.seed * 100003 + index * 101)
        )
    body = dict(bodies[0])
    body["input_ids"] = [b["input_ids"] for b in bodies]
    body["sampling_params"] = [b["sampling_params"] for b in bodies]
    return records, body


async def _run(url: str, sessions: list[Session], load: LoadSpec) -> WorkloadResult:
    rng = random.Random(load.seed)
    limit = asyncio.Semaphore(load.max_concurrency or 1_000_000)
    records: list[RequestRecord] = []
    lags: list[float] = []
    connector = aiohttp.TCPConnector(limit=load.max_concurrency or 1000)
    # read_bufsize bounds one line of the stream (cumulative text of a long output).
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=load.timeout_s),
        read_bufsize=LINE_LIMIT,
    ) as client:
        watch = asyncio.create_task(_loop_lag(lags))
        t0 = time.monotonic()

        async def session(index: int, s: Session) -> None:
            history: list[int] = []
            for turn_no, turn in enumerate(s.turns):
                if turn.delay_s:
                    await asyncio.sleep(turn.delay_s)
                prompt = history + turn.new_ids if turn.text is None else []
                record = RequestRecord(
                    session=index,
                    turn=turn_no,
                    success=False,
                    prompt_tokens=len(prompt),
                    prompt_ids=prompt if turn.text is None else None,
                )
                records.append(record)
                body = _payload(
                    load,
                    prompt,
                    turn.text,
                    turn.output_len,
                    seed=load.seed * 100003 + index * 101 + turn_no,
                )
                async with limit:
                    await _send(client, url, load, record, body, t0)
                if not record.success:
                    return
                history = prompt + (record.output_ids or [])
                if record.prompt_ids is None:  # a text prompt: only the server knows its length
                    record.prompt_tokens = int(record.meta.get("prompt_tokens", 0))

        async def batch(first: int, group: list[Session]) -> None:
            batch_records, body = _batch_request(load, first, group)
            records.extend(batch_records)
            async with limit:
                await _send(client, url, load, batch_records, body, t0)

        many = load.batch_size > 1
        starts = _batches(load, sessions) if many else list(enumerate(sessions))
        tasks = []
        for index, what in starts:
            if load.duration_s is not None and time.monotonic() - t0 > load.duration_s:
                break
            if isinstance(what, list):
                tasks.append(asyncio.create_task(batch(index, what)))
            else:
                tasks.append(asyncio.create_task(session(index, what)))
            if math.isfinite(load.request_rate):
                await asyncio.sleep(rng.expovariate(load.request_rate))
        await asyncio.gather(*tasks)
        duration = time.monotonic() - t0
        watch.cancel()
    return WorkloadResult(
        records=records,
        duration_s=duration,
        load=load,
        client_loop_lag_s=rank_percentiles(lags, (50, 99)),
    )


def run_workload(url: str, sessions: list[Session], load: LoadSpec | None = None) -> WorkloadResult:
    """Drive `sessions` against the server at `url` and return every request's record."""
    started = time.thread_time()
    result = asyncio.run(_run(url, sessions, load or LoadSpec()))
    result.client_cpu_s = time.thread_time() - started
    return result


__all__ = ["LoadSpec", "RequestRecord", "WorkloadResult", "run_workload", "Turn", "Session"]
