"""The accuracy gate: baseline and candidate answer a fixed prompt set greedily; tokens and
log-probabilities are compared.

A random-weight model's argmax flips on tiny numeric changes, so identical tokens are not
required. For each prompt the two answers are compared position by position up to and including
the first position where the tokens differ (after it the contexts differ and nothing more is
comparable). At every compared position the top-k next-token distributions are compared by total
variation distance (TV, over the union of both top-k sets; a token missing from one side counts
with probability 0 there). The gate fails when

- any compared position has TV above `max_tv`, or
- the tokens differ at a position where baseline was confident: the baseline's log-probability
  margin between its choice and the candidate's choice is above `max_flip_margin` (a flip at a
  near-tie is a numeric wobble; a flip past a clear margin is a different model).
"""

from __future__ import annotations

import math
import random
from typing import Any

import httpx
from pydantic import BaseModel, Field

from infra_agent.serving.datasets import FIRST_ID


class GateConfig(BaseModel):
    prompts: int = 8
    prompt_len: int = 32
    output_len: int = 24
    top_k: int = 10
    max_tv: float = 0.05
    """Largest allowed total-variation distance between next-token distributions."""
    max_flip_margin: float = 0.05
    """Largest baseline log-prob margin (nats) at which a token flip is still a tie."""


class Answer(BaseModel):
    """One greedy answer: tokens and, per position, the top-k {token id: log-prob}."""

    ids: list[int]
    top: list[dict[int, float]]


class GateResult(BaseModel):
    passed: bool
    prompts: int
    identical: int
    """Prompts answered with identical tokens."""
    max_tv: float
    """Largest TV distance over all compared positions."""
    positions: int
    """Positions compared."""
    detail: str = ""
    divergences: list[str] = Field(default_factory=list)

    def render(self) -> str:
        return (
            f"accuracy gate {'pass' if self.passed else 'FAIL'}: {self.identical}/{self.prompts} identical, "
            f"max TV {self.max_tv:.4f} over {self.positions} positions"
            + (f"; {self.detail}" if self.detail else "")
        )


def gate_prompts(config: GateConfig, *, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [rng.randrange(FIRST_ID, vocab_size) for _ in range(config.prompt_len)]
        for _ in range(config.prompts)
    ]


def answer(
    url: str,
    prompts: list[list[int]],
    config: GateConfig,
    timeout_s: float = 120.0,
    *,
    sampling_seed: int | None = None,
) -> list[Answer]:
    """Greedy answers with top-k log-probs from SGLang's native /generate (one batched call).
    With `sampling_seed`, sampled at temperature 1 instead, prompt i with seed
    `sampling_seed + i` (SGLang's seeded sampling: the same tokens for the same logits)."""
    if sampling_seed is None:
        sampling: Any = {
            "max_new_tokens": config.output_len,
            "temperature": 0.0,
            "ignore_eos": True,
        }
    else:
        sampling = [
            {
                "max_new_tokens": config.output_len,
                "temperature": 1.0,
                "ignore_eos": True,
                "sampling_seed": (sampling_seed + i) % (2**31),
            }
            for i in range(len(prompts))
        ]
    body = {
        "input_ids": prompts,
        "sampling_params": sampling,
        "return_logprob": True,
        "top_logprobs_num": config.top_k,
        "logprob_start_len": -1,
    }
    resp = httpx.post(url + "/generate", json=body, timeout=timeout_s)
    resp.raise_for_status()
    out = []
    for item in resp.json():
        meta: dict[str, Any] = item["meta_info"]
        ids = [int(t[1]) for t in meta["output_token_logprobs"]]
        top = [{int(t[1]): float(t[0]) for t in pos} for pos in meta["output_top_logprobs"]]
        out.append(Answer(ids=ids, top=top))
    return out


def tv_distance(a: dict[int, float], b: dict[int, float]) -> float:
    """Total variation between two top-k distributions given as {id: log-prob}."""
    keys = set(a) | set(b)
    return 0.5 * sum(
        abs(math.exp(a.get(k, -math.inf)) - math.exp(b.get(k, -math.inf))) for k in keys
    )


def compare_answers(base: list[Answer], cand: list[Answer], config: GateConfig) -> GateResult:
    identical = positions = 0
    worst = 0.0
    problems: list[str] = []
    notes: list[str] = []
    for p, (b, c) in enumerate(zip(base, cand, strict=True)):
        if b.ids == c.ids:
            identical += 1
        for i, (tb, tc) in enumerate(zip(b.top, c.top, strict=False)):
            positions += 1
            tv = tv_distance(tb, tc)
            worst = max(worst, tv)
            if tv > config.max_tv:
                problems.append(f"prompt {p} position {i}: TV {tv:.3f} > {config.max_tv}")
                break
            if b.ids[i] != c.ids[i]:
                margin = tb.get(b.ids[i], -math.inf) - tb.get(c.ids[i], -math.inf)
                where = f"prompt {p} position {i}: token {b.ids[i]} -> {c.ids[i]}, baseline margin {margin:.3f} nats"
                (problems if margin > config.max_flip_margin else notes).append(where)
                break
    return GateResult(
        passed=not problems,
        prompts=len(base),
        identical=identical,
        max_tv=worst,
        positions=positions,
        detail=problems[0] if problems else "",
        divergences=(problems + notes)[:10],
    )
