"""Microbenchmark runner: baseline vs candidate, interleaved, with a confidence interval.

Python API (stable):
- `compare_samples(baseline, candidate, *, higher_is_better, confidence=0.95, seed=0,
  paired=False, equivalence=0.02) -> Comparison` — statistics on samples you already have
  (see `feedback.bench.compare`).
"""

from infra_agent.feedback.bench.compare import BenchVerdict, Comparison, compare_samples

__all__ = ["BenchVerdict", "Comparison", "compare_samples"]
