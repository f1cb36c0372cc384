"""The harness of serving correctness-under-load tasks: outputs under load against the same
tokens scored alone.

    class TaskHarness(LoadCorruptionHarness):
        deployment_path = Path(__file__).parent / "deployment.toml"

sample(arm, seed): `num_prompts` coding-agent conversations served together (a prefix they all
    share, a context each, `turns` short turns in order; every turn sampled with its own seed
    and top-k log-probabilities), then the prefix cache emptied and every turn's prompt and
    output scored again alone by a prefill (`logprob_start_len` at the prompt's last token: the
    distribution at every output position in one forward, from KV computed afresh). A request is
    corrupted when, at some output position, the top-k log-probabilities under load and alone
    differ by more than `corruption_nats` (`logprob_shift`): the same context must give the same
    distribution, and batching and bf16 KV move it by far less (about 0.03 nats here; reported
    as the clean requests' largest shift). Reports the counts `corrupted` of `turns` (a rate
    metric: the experiment pools them over samples), the rate per 1k and this sample's 95%
    upper bound.
check, health: as `ServingHarness` (the gate against the baseline, the output health guard).
diagnose(arm): the rate under load, the same requests at a low concurrency, and which requests
    were corrupted (`serving.harness.corruption_diagnosis`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from pydantic import BaseModel

from infra_agent.judgement.intervals import poisson_upper
from infra_agent.serving.harness.base import ServingHarness
from infra_agent.serving.load.datasets import Session, Turn, coding_agent_sessions
from infra_agent.tasks.harness import Arm, IncorrectOutput

TOP_K = 5


class Scored(BaseModel):
    """One request: what it returned under load and how far that is from its alone scoring."""

    prompt: list[int]
    output: list[int]
    top: list[dict[int, float]]
    """Top-k log-probs at each output position, as returned under load."""
    alone: list[dict[int, float]] = []
    """Top-k log-probs at each output position when the prompt and output are scored alone."""
    max_shift_nats: float = 0.0
    """The largest `logprob_shift` over the output positions."""
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


def logprob_shift(loaded: dict[int, float], alone: dict[int, float]) -> float:
    """The largest log-probability change (nats) between two top-k lists, of a token in either:
    exact for tokens in both; for a token in one list only, the amount by which it exceeds the
    other list's smallest entry (its log-prob there is at most that), a lower bound. Log space,
    not total variation: the tiny model's distributions are flat (top probability 0.03-0.1), so a
    context change that moves log-probs by 0.1-0.6 nats moves top-k mass by only a few 0.01."""
    if not loaded or not alone:
        return 0.0
    floor_loaded, floor_alone = min(loaded.values()), min(alone.values())
    shift = 0.0
    for token, lp in loaded.items():
        other = alone.get(token)
        shift = max(shift, abs(lp - other) if other is not None else lp - floor_alone)
    for token, lp in alone.items():
        if token not in loaded:
            shift = max(shift, lp - floor_loaded)
    return shift


async def _rescore(client: httpx.AsyncClient, url: str, scored: Scored) -> None:
    # Scoring starts at the prompt's last token: SGLang reports no distribution for the first
    # scored position, and the one after it is the distribution output[0] was sampled from.
    body = {
        "input_ids": scored.prompt + scored.output,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": len(scored.prompt) - 1,
        "top_logprobs_num": TOP_K,
    }
    resp = await client.post(url + "/generate", json=body)
    resp.raise_for_status()
    scored.alone = [_top(pos) for pos in resp.json()["meta_info"]["input_top_logprobs"][1:]]
    if len(scored.alone) != len(scored.output):
        raise RuntimeError(
            f"rescoring returned {len(scored.alone)} distributions for {len(scored.output)} "
            "output tokens"
        )
    for j, (loaded, single) in enumerate(zip(scored.top, scored.alone, strict=True)):
        shift = logprob_shift(loaded, single)
        if shift > scored.max_shift_nats:
            scored.max_shift_nats, scored.worst_position = shift, j


async def _flush(client: httpx.AsyncClient, url: str) -> None:
    """Empty the prefix cache (so what is scored next is computed afresh); retried while the
    server still finishes requests."""
    for _ in range(50):
        resp = await client.post(url + "/flush_cache")
        if resp.status_code == 200:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(
        f"the server would not flush its cache: {resp.status_code} {resp.text[:200]}"
    )


def loaded_then_alone(
    url: str,
    sessions: list[Session],
    seed: int,
    *,
    concurrency: int | None = None,
    rescore_concurrency: int = 2,
    timeout_s: float = 600.0,
) -> list[Scored]:
    """Serve `sessions` together (at most `concurrency` sessions in flight; each session's turns
    in order, every turn's prompt the conversation so far), then empty the prefix cache and
    score every turn's prompt and output alone. One Scored per turn, in session order."""

    async def run() -> list[Scored]:
        limits = httpx.Limits(max_connections=None)
        async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
            gate = asyncio.Semaphore(concurrency or len(sessions))

            async def session(i: int, turns: list[Turn]) -> list[Scored]:
                done: list[Scored] = []
                context: list[int] = []
                async with gate:
                    for t, turn in enumerate(turns):
                        context = context + turn.new_ids
                        one = await _generate(
                            client, url, context, turn.output_len, seed + 7919 * i + t
                        )
                        context = context + one.output
                        done.append(one)
                return done

            per_session = await asyncio.gather(
                *(session(i, s.turns) for i, s in enumerate(sessions))
            )
            scored = [one for turns in per_session for one in turns]
            await _flush(client, url)
            alone = asyncio.Semaphore(rescore_concurrency)

            async def rescore(one: Scored) -> None:
                async with alone:
                    await _rescore(client, url, one)

            await asyncio.gather(*(rescore(one) for one in scored))
            return scored

    return asyncio.run(run())


class LoadCorruptionHarness(ServingHarness):
    def sessions(self, prompts: int, *, seed: int) -> list[Session]:
        """Coding-agent conversations: a prefix all share, a context each, short turns."""
        p = self.params
        return coding_agent_sessions(
            prompts,
            vocab_size=self.vocab,
            shared_prefix_len=int(p["shared_prefix_len"]),
            context_len=int(p["input_len"]),
            turns=int(p["turns"]),
            user_len=int(p["user_len"]),
            output_len=int(p["output_len"]),
            seed=seed,
        )

    def serve(self, arm: Arm, seed: int, concurrency: int | None = None) -> list[Scored]:
        p = self.params
        conc = concurrency if concurrency is not None else int(p["max_concurrency"]) or None
        scored = self.server(arm).call(
            loaded_then_alone,
            self.sessions(int(p["num_prompts"]), seed=seed),
            seed % (2**31),
            concurrency=conc,
        )
        short = [s for s in scored if len(s.output) != int(p["output_len"])]
        if short:
            raise IncorrectOutput(
                f"{len(short)} requests returned {len(short[0].output)} tokens, asked for "
                f"{p['output_len']}"
            )
        return scored

    def corrupted(self, scored: list[Scored]) -> list[Scored]:
        limit = float(self.params["corruption_nats"])
        return [s for s in scored if s.max_shift_nats > limit]

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        """Counts for a rate metric (`corrupted` of `turns`, pooled over samples by the
        experiment), with the rate and its 95% upper bound for this sample alone."""
        scored = self.serve(arm, seed)
        bad = self.corrupted(scored)
        n = len(scored)
        clean = [s.max_shift_nats for s in scored if s not in bad]
        return {
            "corrupted": float(len(bad)),
            "turns": float(n),
            "corrupted_per_1k": 1e3 * len(bad) / n,
            "corruption_ucb_per_1k": 1e3 * poisson_upper(len(bad)) / n,
            "clean_max_shift_nats": max(clean, default=0.0),
        }

    def diagnose(self, arm: Arm) -> Any:
        from infra_agent.serving.harness.corruption_diagnosis import diagnose_corruption

        return diagnose_corruption(self, arm)
