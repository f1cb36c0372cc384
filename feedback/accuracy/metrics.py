"""Difference between two tensors, in one fused chunked pass: `tensor_diff(a, b) -> TensorDiff`.

Measures (a = baseline, b = candidate, d = b - a; per-chunk sums accumulated in float64):
- `rel_diff` = 1 - 2·Σab / Σ(a² + b²) (SGLang's comparator; 0 when equal, 1 when orthogonal);
- `max_abs` (with the position of the max as an index tuple), `mean_abs`, `rmse` = sqrt(Σd²/n);
- `sqnr_db` = 10·log10(Σa² / Σd²) (inf when equal);
- `rel_rms` = sqrt(Σd² / Σa²), the relative RMS error (about 4e-3 for one bf16 rounding of
  randn data; `rel_diff` is roughly its square / 2, so it reads orders of magnitude smaller);
- `max_rel` = max|d| / max|a|: the largest error as a fraction of the largest baseline
  magnitude (normwise, so it does not explode at baseline values near zero as |d|/|a| would);
- `max_ulp` = max |d| / ulp(a): ULP error against the baseline, in the less precise dtype;
- `violations`: elements with |d| > atol + rtol·|a| (torch.testing.assert_close's rule).
NaN/inf: equal infinities count as equal; any other non-finite element counts in `nonfinite`
and as a violation with |d| = inf, and is left out of the sums.

How it keeps up with a plain `(b - a).abs().max()` (details in chunk.py): tensors are flattened
and cut into chunks of `CHUNK` elements (512 KB of float32), small enough that after the first
read of a and b every metric's pass over the chunk hits the CPU cache; a few worker threads take
chunks from a shared counter, each running its ops on one OpenMP thread (no pool barrier per small
op). Each chunk's sums are stored by chunk index and added in chunk order in float64 at the end,
so the result does not depend on the number of threads. The location of the max is found
afterwards by re-running the one chunk that holds it. Chunk sums of squares are cascade sums
(float64 redo when float32 squares underflow), more accurate than the 4M-element BLAS dots used
before (rmse was off by 1e-5 relative on 128M elements; now ~1e-7).
"""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.feedback.accuracy.chunk import CHUNK, DEVICE_CHUNK, ChunkSums, run_chunks

# Defaults of torch.testing.assert_close: dtype -> (rtol, atol).
DEFAULT_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def default_tolerance(*dtypes: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for the least precise of `dtypes`, as torch.testing.assert_close would use."""
    tols = [DEFAULT_TOLERANCES.get(d, (0.0, 0.0)) for d in dtypes]
    return max(t[0] for t in tols), max(t[1] for t in tols)


class TensorDiff(BaseModel):
    """How far candidate is from baseline for one tensor."""

    shape: list[int]
    dtypes: list[str]
    """[baseline dtype, candidate dtype]."""
    numel: int
    rel_diff: float
    max_abs: float
    max_abs_at: list[int] = Field(default_factory=list)
    """Index of the largest |difference|."""
    baseline_at_max: float = 0.0
    candidate_at_max: float = 0.0
    mean_abs: float
    rmse: float
    rel_rms: float = 0.0
    """sqrt(Σd² / Σa²): relative RMS error against the baseline (inf when the baseline is 0)."""
    max_rel: float = 0.0
    """max|d| / max|a|: the largest error relative to the largest |baseline| value."""
    peak_abs: float = 0.0
    """max|a| over finite baseline values."""
    sqnr_db: float
    violations: int
    """Elements outside atol + rtol·|baseline|."""
    rtol: float
    atol: float
    nonfinite: int = 0
    """Elements where either side is NaN or infinite."""
    max_ulp: float | None = None
    """Largest ULP error against the baseline, |candidate - baseline| / ulp(baseline), counted
    in the less precise input dtype (bf16 vs float32: bf16 ulps). The count of representable
    values between the two when they share a binade; unbounded near a zero baseline (ulp.py);
    inf on a non-finite disagreement; None unless both inputs are floating point."""

    @property
    def within_tolerance(self) -> bool:
        return self.violations == 0


def _unravel(flat: int, shape: tuple[int, ...]) -> list[int]:
    index = []
    for dim in reversed(shape):
        index.append(flat % dim if dim else 0)
        flat = flat // dim if dim else 0
    return list(reversed(index))


def tensor_diff(
    baseline: torch.Tensor,
    candidate: torch.Tensor,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    chunk: int | None = None,
    threads: int | None = None,
) -> TensorDiff:
    """Compare two tensors of the same shape; tolerances default per dtype (see module doc).

    `chunk`: elements per chunk (default `CHUNK` on CPU, `DEVICE_CHUNK` on a GPU);
    `threads`: CPU worker threads (default: torch's intra-op thread count, at most 4).
    """
    if tuple(baseline.shape) != tuple(candidate.shape):
        raise UserError(
            f"shape mismatch: baseline {tuple(baseline.shape)} vs candidate {tuple(candidate.shape)}"
        )
    if chunk is None:
        chunk = CHUNK if baseline.device.type == "cpu" else DEVICE_CHUNK
    if chunk < 1:
        raise UserError(f"chunk must be at least 1 element, got {chunk}")
    d_rtol, d_atol = default_tolerance(baseline.dtype, candidate.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    a_flat = baseline.detach().reshape(-1)
    b_flat = candidate.detach().reshape(-1)
    n = a_flat.numel()
    sums: ChunkSums = run_chunks(a_flat, b_flat, rtol=rtol, atol=atol, chunk=chunk, threads=threads)
    s_aa, s_bb, s_dd = sums.aa, sums.bb, sums.dd
    rel = s_dd / (s_aa + s_bb) if (s_aa + s_bb) > 0 else 0.0  # = 1 - 2Σab/Σ(a²+b²)
    shape = tuple(baseline.shape)
    max_at = sums.max_at
    peak = _peak_abs(a_flat)
    max_abs = max(sums.max_abs, 0.0)
    return TensorDiff(
        shape=list(shape),
        dtypes=[
            str(baseline.dtype).removeprefix("torch."),
            str(candidate.dtype).removeprefix("torch."),
        ],
        numel=n,
        rel_diff=rel,
        max_abs=max_abs,
        max_abs_at=_unravel(max_at, shape) if n else [],
        baseline_at_max=float(a_flat[max_at]) if n else 0.0,
        candidate_at_max=float(b_flat[max_at]) if n else 0.0,
        mean_abs=sums.abs / n if n else 0.0,
        rmse=math.sqrt(s_dd / n) if n else 0.0,
        rel_rms=_ratio(math.sqrt(s_dd), math.sqrt(s_aa)),
        max_rel=_ratio(max_abs, peak),
        peak_abs=peak,
        sqnr_db=10 * math.log10(s_aa / s_dd) if s_dd > 0 and s_aa > 0 else math.inf,
        violations=sums.violations,
        rtol=rtol,
        atol=atol,
        nonfinite=sums.nonfinite,
        max_ulp=sums.max_ulp,
    )


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def _peak_abs(flat: torch.Tensor) -> float:
    """max |x| over the finite values (one pass without a copy when all are finite)."""
    if flat.numel() == 0:
        return 0.0
    if flat.dtype == torch.bool:
        return float(flat.any())
    if flat.is_complex():
        flat = flat.abs()
    low, high = torch.aminmax(flat)
    peak = max(abs(float(low)), abs(float(high)))
    if math.isfinite(peak):
        return peak
    finite = flat[torch.isfinite(flat)]
    return float(finite.abs().max()) if finite.numel() else 0.0


def worst_positions(
    baseline: torch.Tensor, candidate: torch.Tensor, *, dims: int = 1, k: int = 3
) -> list[tuple[list[int], float]]:
    """The `k` positions over the leading `dims` dimensions (e.g. tokens) with the largest
    max |difference|, as (index, max_abs) pairs, worst first."""
    if baseline.dim() <= dims:
        d = (candidate.double() - baseline.double()).abs().reshape(baseline.shape)
        per_pos = d
    else:
        lead = tuple(baseline.shape[:dims])
        per_pos = torch.zeros(lead, dtype=torch.float64)
        flat_a = baseline.detach().reshape(*lead, -1)
        flat_b = candidate.detach().reshape(*lead, -1)
        rows = flat_a.reshape(-1, flat_a.shape[-1])
        rows_b = flat_b.reshape(-1, flat_b.shape[-1])
        per_row = per_pos.reshape(-1)
        step = max(1, ROWS_CHUNK // max(1, rows.shape[1]))
        for s in range(0, rows.shape[0], step):
            d = (rows_b[s : s + step].double() - rows[s : s + step].double()).abs()
            per_row[s : s + step] = d.nan_to_num(nan=math.inf).amax(dim=1)
    flat = per_pos.reshape(-1)
    values, idx = torch.topk(flat, min(k, flat.numel()))
    shape = tuple(per_pos.shape)
    return [(_unravel(int(i), shape), float(v)) for v, i in zip(values, idx, strict=True)]


ROWS_CHUNK = 1 << 22
"""Elements per step of `worst_positions` (runs once per report, at the first divergence)."""
