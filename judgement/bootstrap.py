"""The bootstrap: two samples of a metric -> a `Comparison` (speedup, interval, noise flags).

`compare_samples(baseline, candidate, higher_is_better=...)` is shared by the microbenchmark
runner (feedback.bench) and the verification cascade (experiments). It is deterministic for a
given `seed`.

Method: bootstrap (percentile interval). Unpaired by default: the ratio of medians, each arm
resampled on its own. With `paired=True` and equal lengths, pairs (b_i, c_i) measured next to
each other (ABAB interleaving, or on the same input) are compared pair by pair: the statistic is
the median of the per-pair ratios, resampled by pairs, which cancels whatever both members of a
pair share (slow drift of the machine, an input that is slower for both arms) instead of letting
it widen the interval; it is the quantity the sign test speaks about. The speedup is oriented
so that > 1 means the candidate is better: baseline/candidate for times
(`higher_is_better=False`), candidate/baseline for throughputs.

The comparison's `verdict` is the microbenchmark's word for the decision rule at a minimum
effect of 0 (`judgement.decision.BENCH_RULE`, `Decision.word`), in this order:
- SAME: the whole interval lies inside the equivalence band [1/(1+m), 1+m] (m = `equivalence`,
  default 2%): any difference is too small to matter at this precision.
- FASTER: the interval lies above 1.   SLOWER: the interval lies below 1.
- AMBIGUOUS: the interval contains 1 and reaches outside the band (not enough data), or
  fewer than `MIN_SAMPLES` (judgement.decision) samples in an arm.

Noise flags (short codes in `noise`, explanations in `noise_detail`):
`high_iqr` (IQR above 10% of the median in an arm), `drift` (medians of the first and second half
of an arm differ by more than 5%), `few_samples` (fewer than 10 in an arm).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from infra_agent.errors import UserError
from infra_agent.judgement.comparison import Comparison
from infra_agent.judgement.decision import BENCH_RULE, decide

FEW_SAMPLES = 10
HIGH_IQR = 0.10
"""Relative IQR (IQR / median) above which an arm is flagged `high_iqr`."""
DRIFT = 0.05
"""Relative change between first-half and second-half medians flagged as `drift`."""
BOOTSTRAP_RESAMPLES = 2000


def _as_array(name: str, values: Sequence[float]) -> np.ndarray:
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise UserError(f"{name} samples are empty")
    if not np.all(np.isfinite(arr)):
        raise UserError(f"{name} samples contain NaN or infinity")
    if np.any(arr <= 0):
        raise UserError(f"{name} samples must be positive (a ratio of medians needs them > 0)")
    return arr


def relative_iqr(values: np.ndarray) -> float:
    """Interquartile range divided by the median (0 for a single value)."""
    q1, med, q3 = np.percentile(values, [25, 50, 75])
    return float((q3 - q1) / med) if med > 0 else math.inf


def half_drift(values: np.ndarray) -> float:
    """Relative change of the median between the first and the second half (0 if < 6 samples)."""
    if values.size < 6:
        return 0.0
    half = values.size // 2
    first, second = float(np.median(values[:half])), float(np.median(values[half:]))
    return abs(second / first - 1.0)


def _noise_flags(arms: dict[str, np.ndarray]) -> tuple[list[str], list[str]]:
    codes: list[str] = []
    detail: list[str] = []
    for name, values in arms.items():
        riqr = relative_iqr(values)
        if riqr > HIGH_IQR:
            codes.append("high_iqr")
            detail.append(f"high_iqr: {name} IQR is {riqr:.0%} of its median")
        drift = half_drift(values)
        if drift > DRIFT:
            codes.append("drift")
            detail.append(f"drift: {name} median moved {drift:.0%} between halves")
        if values.size < FEW_SAMPLES:
            codes.append("few_samples")
            detail.append(f"few_samples: {name} has {values.size} samples")
    # One code per kind, in first-seen order.
    return list(dict.fromkeys(codes)), detail


def _bootstrap_ratios(
    base: np.ndarray, cand: np.ndarray, *, paired: bool, seed: int, resamples: int
) -> np.ndarray:
    """Bootstrap distribution of median(base)/median(cand), or of median(base/cand) over pairs."""
    rng = np.random.default_rng(seed)
    if paired:
        idx = rng.integers(0, base.size, size=(resamples, base.size))
        return np.asarray(np.median((base / cand)[idx], axis=1))
    bi = rng.integers(0, base.size, size=(resamples, base.size))
    ci = rng.integers(0, cand.size, size=(resamples, cand.size))
    return np.median(base[bi], axis=1) / np.median(cand[ci], axis=1)


def compare_samples(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    higher_is_better: bool,
    confidence: float = 0.95,
    seed: int = 0,
    paired: bool = False,
    equivalence: float = 0.02,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Comparison:
    """Compare two samples of a positive metric (times in any unit, or throughputs).

    Raises `UserError` for empty, non-finite or non-positive samples, or `paired=True` with
    arms of different lengths. Deterministic for a given `seed`.
    """
    if not 0.5 <= confidence < 1.0:
        raise UserError(f"confidence must be in [0.5, 1), got {confidence}")
    if equivalence < 0:
        raise UserError(f"equivalence must be >= 0, got {equivalence}")
    base = _as_array("baseline", baseline)
    cand = _as_array("candidate", candidate)
    if paired and base.size != cand.size:
        raise UserError(
            f"paired comparison needs equal sample counts, got {base.size} and {cand.size}"
        )
    ratios = _bootstrap_ratios(base, cand, paired=paired, seed=seed, resamples=resamples)
    if higher_is_better:
        ratios = 1.0 / ratios
    alpha = 1.0 - confidence
    lo, hi = np.quantile(ratios, [alpha / 2, 1 - alpha / 2])
    b_med, c_med = float(np.median(base)), float(np.median(cand))
    if paired:
        speedup = float(np.median(cand / base if higher_is_better else base / cand))
    else:
        speedup = c_med / b_med if higher_is_better else b_med / c_med
    # The percentile interval of a median can exclude the point estimate on tiny samples.
    lo, hi = min(float(lo), speedup), max(float(hi), speedup)
    noise, detail = _noise_flags({"baseline": base, "candidate": cand})
    method = (
        f"bootstrap of the {'median of per-pair ratios (paired' if paired else 'ratio of medians (unpaired'}, "
        f"{resamples} resamples, percentile {confidence:.0%} interval, seed {seed}); "
        f"SAME if the interval lies within ±{equivalence:.0%}"
    )
    comparison = Comparison(
        speedup=speedup,
        ci_low=lo,
        ci_high=hi,
        verdict="AMBIGUOUS",
        noise=noise,
        noise_detail=detail,
        n_baseline=int(base.size),
        n_candidate=int(cand.size),
        baseline_median=b_med,
        candidate_median=c_med,
        baseline_rel_iqr=relative_iqr(base),
        candidate_rel_iqr=relative_iqr(cand),
        higher_is_better=higher_is_better,
        confidence=confidence,
        equivalence=equivalence,
        method=method,
    )
    comparison.verdict = decide(comparison, BENCH_RULE).word
    return comparison
