"""Stress reproduction: the same request N times under background load, anomalies per 10,000.

The method that made a load-dependent race visible in public: a request replayed alone never
misbehaves; replayed many times while other traffic keeps the batches full, a few outputs in
10,000 come back wrong. Here the probe request is sent `repeats` times (greedy, so every answer
should be identical) while `background_concurrency` streams of random requests keep the server
busy. An answer is anomalous when it differs from the most common answer or trips the output
health guard.

    report = run_stress(url, StressSpec(repeats=200, background_concurrency=8, seed=3))
    report.anomalies_per_10k, report.render()
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import aiohttp
from pydantic import BaseModel, Field

from infra_agent.feedback.health import check_output
from infra_agent.serving.load.datasets import FIRST_ID, random_sessions
from infra_agent.serving.load.generator import LINE_LIMIT, LoadSpec, RequestRecord, _send


class StressSpec(BaseModel):
    repeats: int = 100
    """How many times the probe request is sent."""
    probe_concurrency: int = 4
    """Probe copies in flight at once."""
    background_concurrency: int = 8
    """Random background requests in flight at once (0: no load)."""
    prompt_len: int = 64
    output_len: int = 32
    background_input_len: int = 256
    background_output_len: int = 64
    vocab_size: int = 1024
    seed: int = 0


class StressReport(BaseModel):
    repeats: int
    completed: int
    anomalies: int
    """Answers that differ from the modal answer or trip the health guard."""
    distinct_answers: int
    unhealthy: int
    background_requests: int
    anomalies_per_10k: float
    examples: list[str] = Field(default_factory=list)

    def render(self) -> str:
        return (
            f"{self.anomalies_per_10k:.0f} anomalies per 10k ({self.anomalies}/{self.completed} probes, "
            f"{self.distinct_answers} distinct answers, {self.unhealthy} unhealthy) under "
            f"{self.background_requests} background requests"
        )


async def _stress(url: str, spec: StressSpec) -> tuple[list[RequestRecord], int]:
    rng = random.Random(spec.seed)
    probe_ids = [rng.randrange(FIRST_ID, spec.vocab_size) for _ in range(spec.prompt_len)]
    greedy = LoadSpec(temperature=0.0, seed=spec.seed)
    noisy = LoadSpec(temperature=1.0, seed=spec.seed + 1)
    done = asyncio.Event()
    background = 0
    probes: list[RequestRecord] = []
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=greedy.timeout_s), read_bufsize=LINE_LIMIT
    ) as client:
        t0 = asyncio.get_running_loop().time()

        async def load(worker: int) -> None:
            nonlocal background
            n = 0
            while not done.is_set():
                s = random_sessions(1, spec.background_input_len, spec.background_output_len,
                                    vocab_size=spec.vocab_size, seed=spec.seed * 7919 + worker * 1_000_003 + n)[0]  # fmt: skip
                rec = RequestRecord(
                    session=-1, turn=0, success=False, prompt_tokens=len(s.turns[0].new_ids)
                )
                body = {"input_ids": s.turns[0].new_ids, "stream": True,
                        "sampling_params": {"max_new_tokens": s.turns[0].output_len, "temperature": 1.0, "ignore_eos": True}}  # fmt: skip
                await _send(client, url, noisy, rec, body, t0)
                background += 1
                n += 1

        gate = asyncio.Semaphore(spec.probe_concurrency)

        async def probe(i: int) -> None:
            rec = RequestRecord(session=i, turn=0, success=False, prompt_tokens=spec.prompt_len)
            body = {"input_ids": probe_ids, "stream": True,
                    "sampling_params": {"max_new_tokens": spec.output_len, "temperature": 0.0, "ignore_eos": True}}  # fmt: skip
            async with gate:
                await _send(client, url, greedy, rec, body, t0)
            probes.append(rec)

        loaders = [asyncio.create_task(load(w)) for w in range(spec.background_concurrency)]
        try:
            await asyncio.gather(*(probe(i) for i in range(spec.repeats)))
        finally:
            done.set()
            await asyncio.gather(*loaders, return_exceptions=True)
    return probes, background


def run_stress(url: str, spec: StressSpec | None = None) -> StressReport:
    spec = spec or StressSpec()
    probes, background = asyncio.run(_stress(url, spec))
    ok = [p for p in probes if p.success]
    answers = Counter(tuple(p.output_ids) if p.output_ids is not None else p.text for p in ok)
    modal = answers.most_common(1)[0][0] if answers else None
    anomalies = unhealthy = 0
    examples: list[str] = []
    for p in ok:
        key = tuple(p.output_ids) if p.output_ids is not None else p.text
        health = check_output(p.text, p.output_ids, p.meta)
        unhealthy += not health.healthy
        if key != modal or not health.healthy:
            anomalies += 1
            if len(examples) < 3:
                why = "differs from the modal answer" if key != modal else health.issues[0].rule
                examples.append(f"probe {p.session}: {why}: {p.text[:60]!r}")
    return StressReport(
        repeats=spec.repeats,
        completed=len(ok),
        anomalies=anomalies,
        distinct_answers=len(answers),
        unhealthy=unhealthy,
        background_requests=background,
        anomalies_per_10k=1e4 * anomalies / len(ok) if ok else 0.0,
        examples=examples,
    )
