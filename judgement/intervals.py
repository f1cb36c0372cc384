"""Exact intervals and tails for counts: the sign test's interval of per-pair ratios, binomial
tails, Clopper-Pearson and Wilson intervals of a proportion, the Poisson upper bound of a count,
and the unbiased pass@k estimator.

Each is distribution-free or exact for the counts it is given; none assumes normal noise except
`wilson` and `share_error`, which say so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

CONFIDENCE = 0.95


def sign_interval(
    ratios: list[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """Distribution-free interval for the median per-pair ratio (the sign test's order
    statistics): exact coverage >= `confidence` for independent pairs, whatever the noise.
    None when there are too few pairs to reach that confidence."""
    n = len(ratios)
    alpha = (1.0 - confidence) / 2
    k, tail = 0, 0.0
    while True:  # largest k with P(Binom(n, 1/2) <= k - 1) <= alpha
        tail_next = tail + math.comb(n, k) / 2**n
        if tail_next > alpha:
            break
        tail, k = tail_next, k + 1
    if k == 0:
        return None
    ordered = sorted(ratios)
    return ordered[k - 1], ordered[n - k]


def _log_pmf(i: int, n: int, p: float) -> float:
    return (
        math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
        + i * math.log(p) + (n - i) * math.log1p(-p)
    )  # fmt: skip


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def binom_upper_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed term by term (exact for small n)."""
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def _bisect(f: Callable[[float], float], want: float, increasing: bool) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if (f(mid) < want) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Exact two-sided interval for a binomial proportion after `k` successes in `n` trials."""
    alpha = (1.0 - confidence) / 2
    low = 0.0 if k == 0 else _bisect(lambda p: 1.0 - binom_cdf(k - 1, n, p), alpha, True)
    high = 1.0 if k == n else _bisect(lambda p: binom_cdf(k, n, p), alpha, False)
    return low, high


def poisson_upper(k: int, confidence: float = CONFIDENCE) -> float:
    """One-sided upper confidence bound on a Poisson mean after observing `k` events (exact:
    the mean whose P(X <= k) is 1 - confidence, found by bisection)."""
    alpha = 1.0 - confidence

    def cdf(lam: float) -> float:
        term = total = math.exp(-lam)
        for i in range(1, k + 1):
            term *= lam / i
            total += term
        return total

    lo, hi = 0.0, k + 10.0 * math.sqrt(k + 1) + 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > alpha else (lo, mid)
    return hi


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a share (`z` = 1.96: 95%, normal approximation); (0, 0) for
    n = 0."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def share_error(samples: int) -> float:
    """The 95% sampling error of a share at its widest (a 50% share), were the `samples`
    independent: 1.96 * sqrt(0.25 / samples); 1.0 without samples."""
    return 1.96 * math.sqrt(0.25 / samples) if samples else 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k over `n` attempts with `c` successes: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)
