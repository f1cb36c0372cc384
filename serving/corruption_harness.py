"""The harness of serving correctness-under-load tasks: outputs under load against the same
tokens scored alone.

    class TaskHarness(LoadCorruptionHarness):
        deployment_path = Path(__file__).parent / "deployment.toml"

sample(arm, seed): `num_prompts` requests sent at once (each sampled with its own seed and
    top-k log-probabilities), then each request's prompt and output scored again alone by a
    prefill (`logprob_start_len` at the prompt's end: the distribution at every output position
    in one forward, nothing to race with). A request is corrupted when, at some output position,
    its distribution under load and the one scored alone are further apart than
    `corruption_tv` in total variation: the same context must give the same distribution, and
    batching alone moves it by far less (reported as the clean requests' largest TV). Metric:
    `corruption_ucb_per_1k` (95% upper bound), also the raw rate and the requests' throughput.
check, health: as `ServingHarness` (the gate against the baseline, the output health guard).
diagnose(arm): the rate under load, the same requests at a low concurrency, and which requests
    were corrupted (`serving.corruption`).
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
from pydantic import BaseModel

from infra_agent.serving.accuracy import tv_distance
from infra_agent.serving.datasets import random_sessions
from infra_agent.serving.harness import ServingHarness
from infra_agent.tasks.harness import Arm, IncorrectOutput, poisson_upper

TOP_K = 5


class Scored(BaseModel):
    """One request: what it returned under load and how far that is from its alone scoring."""

    prompt: list[int]
    output: list[int]
    top: list[dict[int, float]]
    """Top-k log-probs at each output position, as returned under load."""
    max_tv: float = 0.0
    worst_position: int = -1


def _top(entries: list[Any] | None) -> dict[int, float]:
    return {int(t[1]): float(t[0]) for t in entries or [] if t is not None}


async def _generate(
    client: httpx.AsyncClient, url: str, prompt: list[int], output_len: int, seed: int
) -> Scored:
    body = {
        "input_ids": prompt,
        "sampling_params": {
            "max_new_tokens": output_len, "temperature": 1.0, "ignore_eos": True,
            "sampling_seed": seed,
        },
        "return_logprob": True,
        "top_logprobs_num": TOP_K,
    }  # fmt: skip
    resp = await client.post(url + "/generate", json=body)
    resp.raise_for_status()
    meta = resp.json()["meta_info"]
    ids = [int(t[1]) for t in meta["output_token_logprobs"]]
    return Scored(prompt=prompt, output=ids, top=[_top(pos) for pos in meta["output_top_logprobs"]])


async def _rescore(client: httpx.AsyncClient, url: str, scored: Scored) -> None:
    body = {
        "input_ids": scored.prompt + scored.output,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": len(scored.prompt),
        "top_logprobs_num": TOP_K,
    }
    resp = await client.post(url + "/generate", json=body)
    resp.raise_for_status()
    alone = [_top(pos) for pos in resp.json()["meta_info"]["input_top_logprobs"]]
    for j, (loaded, single) in enumerate(zip(scored.top, alone, strict=False)):
        tv = tv_distance(loaded, single)
        if tv > scored.max_tv:
            scored.max_tv, scored.worst_position = tv, j


def loaded_then_alone(
    url: str,
    prompts: list[list[int]],
    output_len: int,
    seed: int,
    *,
    concurrency: int | None = None,
    rescore_concurrency: int = 2,
    timeout_s: float = 600.0,
) -> list[Scored]:
    """Serve `prompts` together (at most `concurrency` in flight), then score each alone."""

    async def run() -> list[Scored]:
        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
            gate = asyncio.Semaphore(concurrency or len(prompts))

            async def one(i: int, prompt: list[int]) -> Scored:
                async with gate:
                    return await _generate(client, url, prompt, output_len, seed + i)

            scored = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
            alone = asyncio.Semaphore(rescore_concurrency)

            async def rescore(s: Scored) -> None:
                async with alone:
                    await _rescore(client, url, s)

            await asyncio.gather(*(rescore(s) for s in scored))
            return list(scored)

    return asyncio.run(run())


class LoadCorruptionHarness(ServingHarness):
    def prompts(self, seed: int) -> list[list[int]]:
        p = self.params
        sessions = random_sessions(
            int(p["num_prompts"]), int(p["input_len"]), 1, vocab_size=self.vocab, seed=seed
        )
        return [s.turns[0].new_ids for s in sessions]

    def serve(self, arm: Arm, seed: int, concurrency: int | None = None) -> list[Scored]:
        p = self.params
        conc = concurrency if concurrency is not None else int(p["max_concurrency"]) or None
        scored = self.server(arm).call(
            loaded_then_alone, self.prompts(seed), int(p["output_len"]), seed % (2**31),
            concurrency=conc,
        )  # fmt: skip
        short = [s for s in scored if len(s.output) != int(p["output_len"])]
        if short:
            raise IncorrectOutput(
                f"{len(short)} requests returned {len(short[0].output)} tokens, asked for "
                f"{p['output_len']}"
            )
        return scored

    def corrupted(self, scored: list[Scored]) -> list[Scored]:
        limit = float(self.params["corruption_tv"])
        return [s for s in scored if s.max_tv > limit]

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        scored = self.serve(arm, seed)
        bad = self.corrupted(scored)
        n = len(scored)
        clean = [s.max_tv for s in scored if s not in bad]
        return {
            "corruption_ucb_per_1k": 1e3 * poisson_upper(len(bad)) / n,
            "corrupted_per_1k": 1e3 * len(bad) / n,
            "clean_max_tv": max(clean) if clean else math.nan,
        }

    def diagnose(self, arm: Arm) -> Any:
        from infra_agent.serving.corruption import diagnose_corruption

        return diagnose_corruption(self, arm)
