"""`Comparison`: baseline vs candidate on one metric, the improvement factor and its interval.

Built by the bootstrap (`judgement.bootstrap.compare_samples`) or from pooled event counts
(`judgement.rates.as_comparison`), and read by the decision rule (`judgement.decision.decide`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

BenchVerdict = Literal["FASTER", "SLOWER", "SAME", "AMBIGUOUS"]
"""The microbenchmark's word for a decision (`judgement.decision.Decision.word`)."""


class Comparison(BaseModel):
    """Baseline vs candidate on one metric. `speedup` > 1 means the candidate is better."""

    speedup: float
    """Improvement factor: baseline/candidate medians for times, candidate/baseline otherwise
    (paired: the median of the per-pair ratios)."""
    ci_low: float
    """Lower end of the `confidence` interval of `speedup`."""
    ci_high: float
    verdict: BenchVerdict
    """The microbenchmark's word: a view of `decide(self, BENCH_RULE)` (judgement.decision)."""
    noise: list[str] = Field(default_factory=list)
    """Noise flag codes: high_iqr, drift, few_samples, short_samples (judgement.bootstrap)."""
    noise_detail: list[str] = Field(default_factory=list)
    """One line per flag, with the numbers."""
    n_baseline: int
    n_candidate: int
    baseline_median: float
    candidate_median: float
    baseline_rel_iqr: float = 0.0
    """IQR / median of the baseline samples."""
    candidate_rel_iqr: float = 0.0
    higher_is_better: bool = False
    confidence: float = 0.95
    equivalence: float = 0.02
    """Half-width of the band around 1 inside which a difference counts as SAME."""
    method: str = ""

    def render(self) -> str:
        """Decisive numbers first, one or two lines."""
        line = (
            f"{self.verdict}: speedup {self.speedup:.3f}x "
            f"({self.confidence:.0%} CI {self.ci_low:.3f}-{self.ci_high:.3f}); "
            f"median baseline {self.baseline_median:.4g} -> candidate {self.candidate_median:.4g} "
            f"(n={self.n_baseline}/{self.n_candidate})"
        )
        if self.noise_detail:
            line += "\nnoise: " + "; ".join(self.noise_detail)
        return line
