"""Microbenchmark runner: baseline vs candidate, interleaved, with a confidence interval.

Python API (stable):
- `compare_samples(baseline, candidate, *, higher_is_better, confidence=0.95, seed=0,
  paired=False, equivalence=0.02) -> Comparison` — statistics on samples you already have
  (the judgement core's bootstrap, `judgement.bootstrap`): speedup (> 1 better),
  ci_low/ci_high, verdict FASTER|SLOWER|SAME|AMBIGUOUS (a view of the core's decision rule,
  `judgement.decision.Decision.word`), noise flags.
- `run_bench(baseline, candidate, *, min_sample_s=0.005, ci_width=0.02, equivalence=0.02,
  budget_s=10, clock="wall", with_counters=False, ...) -> BenchResult` — time two arms
  interleaved (ABBA...) with adaptive stopping (see `feedback.bench.runner`); samples are seconds
  per call; `clock="cpu"` (thread CPU time) is far less noisy on a shared machine for
  single-threaded CPU-bound code.
  Arms are zero-argument callables (CPU, perf_counter_ns) or targets from `make_target(fn,
  device='cuda', flush_l2=..., cuda_graph=...)`, `CommandTarget('shell command')`,
  `WorkerTarget('module:function')` (separate process), `PipeTarget(stdin, stdout, name=...)`
  (a process started elsewhere, e.g. in a sandbox, speaking the worker protocol).
- `load_callable('module:function' | 'file.py:function')` — resolve user code.
"""

from infra_agent.feedback.bench.counters import HardwareCounters
from infra_agent.feedback.bench.runner import BenchResult, make_target, run_bench
from infra_agent.feedback.bench.targets import (
    CallableTarget,
    CommandTarget,
    CudaTarget,
    PipeTarget,
    Target,
    WorkerTarget,
)
from infra_agent.feedback.bench.usercode import load_callable
from infra_agent.judgement import BenchVerdict, Comparison, compare_samples

__all__ = [
    "BenchResult",
    "BenchVerdict",
    "CallableTarget",
    "CommandTarget",
    "Comparison",
    "CudaTarget",
    "HardwareCounters",
    "PipeTarget",
    "Target",
    "WorkerTarget",
    "compare_samples",
    "load_callable",
    "make_target",
    "run_bench",
]
