"""Accuracy diff across execution paths: where two paths of the same computation part ways.

Python API (stable):
- `probe(name, tensor)` and `with capture(module=None) as tensors:` — record named
  intermediates in execution order (probes.py); `save_dump(tensors, dir)`, `load_dump(dir)` for
  tensors written by another process or rank.
- `compare_paths(baseline, candidate, *, reference=None, stages=None, stage_inputs=None,
  rtol=None, atol=None, rule=None) -> AccuracyReport` — per-probe relative RMS and max relative
  error, rel diff, max/mean abs diff with the
  location of the max, SQNR, error against a float64 reference with attribution, the first
  divergence with its worst positions, self-added vs inherited error; verdict
  PASS | FAIL | PRECISION_FLOOR; with a `ToleranceRule` (an experiment's accuracy rule), whether
  the candidate would pass it and why not (report.py).
- `tensor_diff(a, b) -> TensorDiff` — one fused chunked pass over two tensors (rel diff, max/mean
  abs with location, RMSE, SQNR, max ULP distance, tolerance violations, NaN/inf), sums in
  float64 (metrics.py, chunk.py, ulp.py).
- `error_sweep(run, sizes) -> SweepReport` — error at each problem size and the log-log slopes
  of absolute and relative error (sweep.py).
Every record has `.render()`: a short text for a model, decisive numbers first.
"""

from infra_agent.feedback.accuracy.metrics import (
    DEFAULT_TOLERANCES,
    TensorDiff,
    default_tolerance,
    tensor_diff,
    worst_positions,
)
from infra_agent.feedback.accuracy.probes import capture, load_dump, probe, save_dump
from infra_agent.feedback.accuracy.report import (
    AccuracyReport,
    AccuracyVerdict,
    ErrorSize,
    ProbeResult,
    ToleranceRule,
    compare_paths,
)
from infra_agent.feedback.accuracy.sweep import SweepPoint, SweepReport, error_sweep, loglog_slope

__all__ = [
    "DEFAULT_TOLERANCES",
    "AccuracyReport",
    "AccuracyVerdict",
    "ErrorSize",
    "ProbeResult",
    "SweepPoint",
    "SweepReport",
    "TensorDiff",
    "ToleranceRule",
    "capture",
    "compare_paths",
    "default_tolerance",
    "error_sweep",
    "load_dump",
    "loglog_slope",
    "probe",
    "save_dump",
    "tensor_diff",
    "worst_positions",
]
