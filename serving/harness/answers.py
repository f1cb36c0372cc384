"""What a serving arm's server answered, judged: every request answered with exactly the tokens
it asked for, counted by the client (`verify_counts`), and the candidate's answers as likely
under the baseline model as the baseline's own answers to the same prompts (`likelihood_test`:
each session's outputs scored once, teacher-forced, by the baseline server).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from infra_agent.serving.harness.accuracy import LikelihoodTest, compare_likelihood
from infra_agent.serving.load.datasets import Session
from infra_agent.serving.load.generator import RequestRecord
from infra_agent.tasks.harness import IncorrectOutput

Scorer = Callable[[Sequence[tuple[list[int], list[int]]]], list[list[float]]]
"""(prompt ids, output ids) pairs -> each output token's log-prob (the baseline server's)."""
ARMS = ("baseline", "candidate")


def likelihood_test(
    runs: dict[str, dict[int, list[RequestRecord]]], seeds: list[int], limit: int,
    rng: random.Random, scored: dict[tuple[str, tuple[int, int]], float], *, score: Scorer,
    alpha: float,
) -> LikelihoodTest:  # fmt: skip
    """The signed-rank test over up to `limit` sessions drawn by `rng` from the runs (arm ->
    seed -> records) of `seeds` both arms answered. `scored` keeps (arm, (seed, session)) -> mean
    log-prob per output token across tests, so `score` sees each session once."""
    by_arm = {name: _by_session(runs[name], seeds) for name in ARMS}
    shared = sorted(set(by_arm["baseline"]) & set(by_arm["candidate"]))
    chosen = sorted(rng.sample(shared, min(limit, len(shared))))
    todo = [(name, key) for name in ARMS for key in chosen if (name, key) not in scored]
    items = [
        (r.prompt_ids, r.output_ids or [])
        for name, key in todo
        for r in by_arm[name][key]
        if r.prompt_ids
    ]
    scores = iter(score(items) if items else [])
    for name, key in todo:
        tokens = [lp for r in by_arm[name][key] if r.prompt_ids for lp in next(scores)]
        scored[(name, key)] = sum(tokens) / len(tokens) if tokens else math.nan
    kept = [
        (scored[("baseline", key)], scored[("candidate", key)]) for key in chosen
        if not any(math.isnan(scored[(name, key)]) for name in ARMS)
    ]  # fmt: skip
    return compare_likelihood([b for b, _ in kept], [c for _, c in kept], alpha=alpha)


def _by_session(
    runs: dict[int, list[RequestRecord]], seeds: list[int]
) -> dict[tuple[int, int], list[RequestRecord]]:
    """(seed, session) -> its records in turn order, for the runs of `seeds` an arm has."""
    out: dict[tuple[int, int], list[RequestRecord]] = {}
    for seed in seeds:
        for r in sorted(runs.get(seed, []), key=lambda r: (r.session, r.turn)):
            out.setdefault((seed, r.session), []).append(r)
    return out


def verify_counts(records: list[RequestRecord], sessions: list[Session]) -> None:
    """Every request was answered with exactly the tokens it asked for, counted by the client:
    token ids received, never the server's `completion_tokens`, which must agree with them."""
    failed = [r for r in records if not r.success]
    if failed:
        raise IncorrectOutput(
            f"{len(failed)}/{len(records)} requests failed; first: {failed[0].error}"
        )
    wanted = {
        (i, t): turn.output_len for i, s in enumerate(sessions) for t, turn in enumerate(s.turns)
    }
    if len(records) != len(wanted):
        raise IncorrectOutput(f"{len(records)} of {len(wanted)} requests were answered")
    for r in records:
        if r.output_ids is None:
            raise IncorrectOutput(f"request {r.session}: the stream carried no token ids")
        claim = r.claimed_tokens
        if claim is not None and claim != r.output_tokens:
            raise IncorrectOutput(
                f"token count inflated: request {r.session} (turn {r.turn}): the server claimed "
                f"{claim} completion tokens, its stream carried {r.output_tokens}"
            )
        n = wanted[(r.session, r.turn)]
        if r.output_tokens != n:
            raise IncorrectOutput(
                f"request {r.session} returned {r.output_tokens} tokens, asked for {n}"
            )
