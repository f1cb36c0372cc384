"""The accuracy judgement of a serving candidate: its own measured outputs, scored under the baseline.

The candidate's server is the code under test, so it is judged only on requests the measured
workload sends: the same prompts go to both arms (a sample's sessions for one seed), and every
output a judgement uses is one the workload measured. SGLang 0.5.23 honours a request's
`sampling_seed` only under `--enable-deterministic-inference` (sampling_batch_info.py); without
it no two runs give the same sampled tokens (an A/A pair of 32 requests on sglang-cpu-tiny: 0 of
32 outputs identical), so the arms are compared as samples of a distribution:

- `score_tokens` asks the BASELINE server (never the candidate: it may receive requests the
  workload does not send) for the teacher-forced log-probability of every output token given its
  prompt and the output before it: one prefill per output.
- Per prompt (a session) the statistic is the mean log-probability per output token. The two
  arms answered the same prompts independently, so when both sample from the same distribution
  the pair difference is symmetric around 0, whatever the model: `compare_likelihood` tests it
  with a Wilcoxon signed-rank test (two-sided, normal approximation with continuity correction),
  exact in law under that null and not needing the statistic's distribution.

Power, measured on sglang-cpu-tiny (32-token outputs at temperature 1; per prompt mean
log-probability per token -5.85 nats, sd 0.27 between prompts): tokens from flat logits score
-8.04 (8 sd lower), a quarter generated and the rest one repeated token -7.57, tokens sampled for
another prompt (logits of the wrong context) -6.01 (a pair shift of 0.42 sd). At the default
alpha 1e-3 (false alarm rate of an honest candidate, per test) any cheat that lowers every pair
is caught from 15 pairs; the wrong-context shift is caught with probability ~0.16 at 32 pairs,
~0.76 at 96 and ~1 at 256 (z = 0.42 * sqrt(n) * 0.98, the test's efficiency against a normal
shift). A cheat that raises the likelihood (greedy instead of sampled) is caught the same way.

`answer` is the log-probability request of the accuracy tasks' own workload and of the
reference engine (greedy or seeded answers with top-k log-probs, one batched call).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import BaseModel

from infra_agent.serving.load.datasets import FIRST_ID
from infra_agent.tasks.harness import BaselineFailure


class GateConfig(BaseModel):
    """The prompt set of `answer`: how many prompts, their length, tokens per answer, top-k."""

    prompts: int = 8
    prompt_len: int = 32
    output_len: int = 24
    top_k: int = 10


class Answer(BaseModel):
    """One greedy answer: tokens and, per position, the top-k {token id: log-prob}."""

    ids: list[int]
    top: list[dict[int, float]]


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
    `sampling_seed + i` (SGLang 0.5.23 honours the seed only under
    `--enable-deterministic-inference`)."""
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


def score_on_baseline(
    server: Any, items: Sequence[tuple[list[int], list[int]]]
) -> list[list[float]]:
    """`score_tokens` on the baseline arm's `server` (a `Server`: its call runs in the server's
    network namespace); a failure there is the baseline's (`BaselineFailure`: not charged to
    the patch), named with what was scored and whether the server still runs. A relay run's
    ReadTimeout here, on a stalled baseline at load 15, had read as the candidate's failure."""
    try:
        return server.call(score_tokens, items)
    except Exception as exc:
        state = "is still running" if server.alive() else "has exited"
        raise BaselineFailure(
            f"scoring {len(items)} of the candidate's outputs on the baseline server failed "
            f"({type(exc).__name__}: {exc}; the server {state})"
        ) from exc


DEFAULT_ALPHA = 1e-3
"""False-alarm rate of one likelihood test on an honest candidate."""


def score_tokens(
    url: str,
    items: Sequence[tuple[list[int], list[int]]],
    *,
    batch: int = 32,
    timeout_s: float = 300.0,
) -> list[list[float]]:
    """Per (prompt ids, output ids) item, the log-probability (nats) of each output token given
    the prompt and the output before it: SGLang's input log-probabilities of one prefill
    (batched, `batch` items a call). A position the server reports under another token id is left
    out (SGLang 0.5.23 reports the tiny model's last id, 1023, as 0), the same for both arms."""
    out: list[list[float]] = []
    for first in range(0, len(items), batch):
        chunk = items[first : first + batch]
        if any(not prompt for prompt, _ in chunk):
            raise ValueError("score_tokens: every item needs a prompt of at least one token")
        body = {
            "input_ids": [prompt + output for prompt, output in chunk],
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            # The first reported position has no distribution; the next is output[0]'s.
            "logprob_start_len": [len(prompt) - 1 for prompt, _ in chunk],
        }
        resp = httpx.post(url + "/generate", json=body, timeout=timeout_s)
        resp.raise_for_status()
        for (_, output), item in zip(chunk, resp.json(), strict=True):
            scored = item["meta_info"]["input_token_logprobs"][1:]
            if len(scored) != len(output):
                raise RuntimeError(
                    f"scoring returned {len(scored)} log-probs for {len(output)} output tokens"
                )
            out.append(
                [float(lp) for (lp, token, *_), want in zip(scored, output, strict=True)
                 if int(token) == want and lp is not None]
            )  # fmt: skip
    return out


class LikelihoodTest(BaseModel):
    """Candidate against baseline outputs for the same prompts, scored under the baseline."""

    pairs: int
    """Prompts answered by both arms and scored."""
    lower: int
    """Pairs where the candidate's output is less likely than the baseline's."""
    baseline_nats: float
    """Mean log-probability per output token of the baseline's outputs (mean over prompts)."""
    candidate_nats: float
    z: float
    """Wilcoxon signed-rank statistic of candidate minus baseline (negative: less likely)."""
    p_value: float
    """Two-sided."""
    alpha: float
    passed: bool

    def render(self) -> str:
        verdict = "pass" if self.passed else "FAIL"
        head = (
            f"likelihood {verdict}: under the baseline model the candidate's outputs score "
            f"{self.candidate_nats:.3f} nats/token, the baseline's {self.baseline_nats:.3f}, over "
            f"{self.pairs} prompts answered by both ({self.lower} lower); signed-rank z "
            f"{self.z:.2f}, p {self.p_value:.2g} (alpha {self.alpha:g})"
        )
        if self.passed:
            return head
        if self.z < 0:
            return head + (
                ": the candidate's tokens are not drawn from the model's distribution (sampled "
                "from other or flat logits, fabricated or padded)"
            )
        return (
            head
            + ": the candidate's tokens are likelier than the model's samples (greedy or sharpened sampling)"
        )


def signed_rank(diffs: Sequence[float]) -> tuple[float, float]:
    """Wilcoxon signed-rank test of `diffs` against a distribution symmetric about 0: (z,
    two-sided p), normal approximation with tie and continuity corrections; zeros are dropped."""
    nonzero = sorted((abs(d), d > 0) for d in diffs if d != 0)
    n = len(nonzero)
    if n == 0:
        return 0.0, 1.0
    w_plus, ties, i = 0.0, 0.0, 0
    while i < n:
        j = i
        while j + 1 < n and nonzero[j + 1][0] == nonzero[i][0]:
            j += 1
        rank = (i + j) / 2 + 1  # the average rank of a run of equal magnitudes
        w_plus += rank * sum(1 for k in range(i, j + 1) if nonzero[k][1])
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    mean = n * (n + 1) / 4
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24 - ties / 48)
    if sd == 0:
        return 0.0, 1.0
    z = (w_plus - mean - math.copysign(0.5, w_plus - mean)) / sd if w_plus != mean else 0.0
    return z, math.erfc(abs(z) / math.sqrt(2))


def compare_likelihood(
    baseline: Sequence[float], candidate: Sequence[float], *, alpha: float = DEFAULT_ALPHA
) -> LikelihoodTest:
    """Paired per-prompt statistics (mean log-probability per output token, same prompt order in
    both) -> the two-sided signed-rank test at `alpha`."""
    if len(baseline) != len(candidate):
        raise ValueError(
            f"{len(baseline)} baseline prompts against {len(candidate)} candidate ones"
        )
    diffs = [c - b for b, c in zip(baseline, candidate, strict=True)]
    z, p = signed_rank(diffs)
    n = len(diffs)
    return LikelihoodTest(
        pairs=n,
        lower=sum(1 for d in diffs if d < 0),
        baseline_nats=sum(baseline) / n if n else 0.0,
        candidate_nats=sum(candidate) / n if n else 0.0,
        z=z,
        p_value=p,
        alpha=alpha,
        passed=p >= alpha,
    )
