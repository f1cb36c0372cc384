"""The column-wise reward helpers give what the scalar functions give, bit for bit:
`rewards.score_results` the `candidate_scores` of every result (None, NaN, infinite, zero and
negative evidence values included), `weighted_totals` the `weighted_total` of every row, and
`round_12` Python's `round(v, 12)`."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from infra_agent.experiments.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)
from infra_agent.trajectories.rewards import (
    CANDIDATE_REWARDS,
    COMPONENTS,
    VERDICT_ORDER,
    candidate_scores,
    round_12,
    score_results,
    weighted_total,
    weighted_totals,
)

EDGES = [math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 1e-300, 1.0, 2.0, 4.0, -1.0, 1e300]


def _value(rng: random.Random) -> float:
    return rng.choice(EDGES) if rng.random() < 0.5 else rng.uniform(-0.5, 5.0)


def _result(rng: random.Random) -> ExperimentResult:
    perf = None
    if rng.random() < 0.6:
        lo = _value(rng)
        perf = PerformanceEvidence(metric="ms", unit="ms", higher_is_better=False,
                                   baseline_median=1, candidate_median=1, speedup=_value(rng),
                                   ci_low=lo, ci_high=_value(rng), n_samples=3)  # fmt: skip
    corr = None
    if rng.random() < 0.6:
        corr = CorrectnessEvidence(
            passed=rng.random() < 0.6,
            baseline_err_f64=rng.choice([None, _value(rng)]),
            candidate_err_f64=rng.choice([None, _value(rng)]),
        )
    return ExperimentResult(
        task="t", patch_id="p", reasons=[],
        verdict=rng.choice([Verdict.IMPROVED] * 4 + list(Verdict)),
        flags=[f for f in Flag if rng.random() < 0.2],
        evidence=Evidence(performance=perf, correctness=corr),
    )  # fmt: skip


def _scalar(result: ExperimentResult) -> list[float] | type[Exception]:
    try:
        scores = candidate_scores(result)
    except (TypeError, ValueError) as e:  # e.g. log10 of a negative error ratio
        return type(e)
    return [scores[f.name] for f in CANDIDATE_REWARDS]


@pytest.mark.parametrize("seed", range(4))
def test_column_wise_scores_are_the_scalar_ones(seed: int) -> None:
    rng = random.Random(seed)
    results = [_result(rng) for _ in range(500)]
    expected = [_scalar(r) for r in results]
    failing = [r for r, e in zip(results, expected, strict=True) if not isinstance(e, list)]
    for r in failing:  # the scalar function raises: so does the column-wise one
        with pytest.raises(_scalar(r)):  # type: ignore[call-overload]
            score_results([r])
    ok = [(r, e) for r, e in zip(results, expected, strict=True) if isinstance(e, list)]
    scored = score_results([r for r, _ in ok])
    want = np.array([e for _, e in ok], dtype=np.float64).reshape(len(ok), len(CANDIDATE_REWARDS))
    assert scored.scores.tobytes() == want.tobytes()  # bit for bit: -0.0 is not 0.0
    assert [VERDICT_ORDER[k] for k in scored.verdict] == [r.verdict for r, _ in ok]
    assert scored.suspicious.tolist() == [Flag.SUSPICIOUS in r.flags for r, _ in ok]
    assert len(ok) > 400 and (scored.scores[:, 0] > 0).sum() > 20  # proven wins among them


def test_no_results_score_an_empty_matrix() -> None:
    assert score_results([]).scores.shape == (0, len(CANDIDATE_REWARDS))


def test_a_view_with_a_null_lower_bound_fails_as_the_scalar_function() -> None:
    """A stored NaN reads back as null (`TrustedExperiment`): scoring it fails either way."""
    perf = PerformanceEvidence.model_construct(speedup=1.5, ci_low=None, ci_high=2.0)
    result = ExperimentResult.model_construct(
        verdict=Verdict.IMPROVED, flags=[], evidence=Evidence.model_construct(performance=perf)
    )
    with pytest.raises(TypeError):
        candidate_scores(result)
    with pytest.raises(TypeError):
        score_results([result])


def _bits(values: list[float]) -> bytes:
    return np.array(values, dtype=np.float64).tobytes()


def test_round_12_is_pythons_round() -> None:
    rng = random.Random(0)
    values = [*EDGES, 2**-13, 3 * 2**-14, 0.5e-12, 999.9999999999995, 1e3, -1e3, 2.0**52]
    for _ in range(100_000):
        kind = rng.random()
        if kind < 0.3:
            values.append(rng.uniform(-10, 10))
        elif kind < 0.6:  # on, or a hair beside, a 12- to 14-decimal number: ties and near-ties
            values.append(rng.randint(-(10**7), 10**7) / 10 ** rng.randint(10, 14)
                          + rng.choice([0.0, 1e-17, -1e-17, 5e-13, -5e-13]))  # fmt: skip
        elif kind < 0.8:  # weighted sums of component values, as the rewards are
            values.append(sum(rng.choice([1.0, 0.5, 2.0, 0.25, 0.1, 3.0])
                              * rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0, rng.random()])
                              for _ in range(8)))  # fmt: skip
        else:
            values.append(rng.uniform(-1, 1) * 10 ** rng.uniform(-16, 4))
    assert _bits(round_12(np.array(values))) == _bits([round(v, 12) for v in values])


@pytest.mark.parametrize("seed", range(3))
def test_weighted_totals_are_the_scalar_totals(seed: int) -> None:
    rng = random.Random(seed)
    # Components lie in [-1, 1] and weights are finite (`parse_weights`): a NaN's sign bit may
    # differ between Python's and numpy's additions, so none is made here.
    parts = [-1.0, -0.5, 0.0, -0.0, 0.5, 1.0, 1 / 3, 1e-13, -5e-13]
    rows = [[rng.choice(parts) if rng.random() < 0.7 else rng.random() for _ in COMPONENTS]
            for _ in range(2000)]  # fmt: skip
    for weights in ({name: rng.choice([0.0, 0.1, 0.25, 1.0, 2.0, 1e6]) for name in COMPONENTS},
                    {name: rng.uniform(-3, 3) for name in COMPONENTS}):  # fmt: skip
        want = [weighted_total(dict(zip(COMPONENTS, row, strict=True)), weights) for row in rows]
        assert _bits(weighted_totals(np.array(rows), weights)) == _bits(want)
