"""Difference between two tensors, in one chunked float64 pass: `tensor_diff(a, b) -> TensorDiff`.

Measures (a = baseline, b = candidate, d = b - a; per-chunk sums accumulated in float64):
- `rel_diff` = 1 - 2·Σab / Σ(a² + b²) (SGLang's comparator; 0 when equal, 1 when orthogonal);
- `max_abs` (with the position of the max as an index tuple), `mean_abs`, `rmse` = sqrt(Σd²/n);
- `sqnr_db` = 10·log10(Σa² / Σd²) (inf when equal);
- `violations`: elements with |d| > atol + rtol·|a| (torch.testing.assert_close's rule).
Tensors are flattened and processed in chunks of `CHUNK` elements so a 1 GiB comparison needs
only a few chunk-sized float64 temporaries. NaN/inf anywhere counts as a violation.
"""

from __future__ import annotations

import math

import torch
from pydantic import BaseModel, Field

from infra_agent.errors import UserError

CHUNK = 1 << 22
"""Elements per chunk (4M: 16 MB per float32 temporary). Smaller chunks are much slower on a
busy machine: every op wakes the intra-op thread pool."""

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
    sqnr_db: float
    violations: int
    """Elements outside atol + rtol·|baseline|."""
    rtol: float
    atol: float
    nonfinite: int = 0
    """Elements where either side is NaN or infinite."""

    @property
    def within_tolerance(self) -> bool:
        return self.violations == 0


class _Sums:
    """Running totals, plus chunk-sized scratch buffers reused across chunks (allocating fresh
    16 MB tensors per chunk costs page faults on every chunk)."""

    def __init__(self, chunk: int, work: torch.dtype, atol: float) -> None:
        self.aa = self.bb = self.dd = self.abs = 0.0
        self.max_abs, self.max_at = -1.0, 0
        self.violations = self.nonfinite = 0
        self.d = torch.empty(chunk, dtype=work)
        self.tol = torch.empty(chunk, dtype=work)
        self.mask = torch.empty(chunk, dtype=torch.bool)
        self.atol = torch.tensor(atol, dtype=work)


def _work_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """float32 for float32/16-bit inputs (both convert exactly), float64 when either is."""
    if torch.float64 in (a.dtype, b.dtype) or not (a.is_floating_point() and b.is_floating_point()):
        return torch.float64
    return torch.float32


def _accumulate(
    t: _Sums, a_in: torch.Tensor, b_in: torch.Tensor, offset: int, rtol: float, atol: float
) -> None:
    """Add one chunk to the running float64 sums.

    Within a chunk the element-wise work runs in the inputs' precision (float32 for float32 and
    16-bit inputs: b - a of two nearby floats is exact, Sterbenz) with accurate reductions
    (BLAS dot, cascade sum); chunk results are accumulated across chunks in float64.
    """
    work = t.d.dtype
    n = a_in.numel()
    a, b = a_in.to(work), b_in.to(work)
    aa, bb = float(torch.dot(a, a)), float(torch.dot(b, b))
    d = torch.sub(b, a, out=t.d[:n])
    dd = float(torch.dot(d, d))
    if not all(math.isfinite(x) for x in (aa, bb, dd)):
        # Slow path, only for chunks holding NaN/inf (or float32 overflow): equal infinities
        # count as equal, any other non-finite element as a violation; the sums skip them.
        a = a_in.to(torch.float64, copy=True)
        b = b_in.to(torch.float64, copy=True)
        both = torch.isfinite(a) & torch.isfinite(b)
        bad = ~both & (a != b)
        t.nonfinite += int(bad.sum())
        a = torch.where(both, a, 0.0)
        b = torch.where(both, b, 0.0)
        aa, bb = float(torch.dot(a, a)), float(torch.dot(b, b))
        d = b - a
        dd = float(torch.dot(d, d))
        d.abs_()
        t.abs += float(d.sum())
        d = torch.where(bad, math.inf, d)
    else:
        d.abs_()
        t.abs += float(d.sum(dtype=torch.float64) if work == torch.float64 else d.sum())
    t.aa += aa
    t.bb += bb
    t.dd += dd
    m = float(d.max())
    if m > t.max_abs:
        t.max_abs, t.max_at = m, offset + int(torch.argmax(d))
    if m > atol and a.dtype != work:  # slow path: float64 copies
        t.violations += int(torch.count_nonzero(d > a.abs().mul_(rtol).add_(atol)))
    elif m > atol:  # otherwise nothing can be out of tolerance
        tol = torch.abs(a, out=t.tol[:n])
        torch.add(t.atol, tol, alpha=rtol, out=tol)  # atol + rtol·|a| in one pass
        t.violations += int(torch.count_nonzero(torch.gt(d, tol, out=t.mask[:n])))


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
    chunk: int = CHUNK,
) -> TensorDiff:
    """Compare two tensors of the same shape; tolerances default per dtype (see module doc)."""
    if tuple(baseline.shape) != tuple(candidate.shape):
        raise UserError(
            f"shape mismatch: baseline {tuple(baseline.shape)} vs candidate {tuple(candidate.shape)}"
        )
    d_rtol, d_atol = default_tolerance(baseline.dtype, candidate.dtype)
    rtol = d_rtol if rtol is None else rtol
    atol = d_atol if atol is None else atol
    a_flat = baseline.detach().reshape(-1)
    b_flat = candidate.detach().reshape(-1)
    n = a_flat.numel()
    totals = _Sums(min(chunk, max(n, 1)), _work_dtype(baseline, candidate), atol)
    for start in range(0, n, chunk):
        _accumulate(
            totals, a_flat[start : start + chunk], b_flat[start : start + chunk], start, rtol, atol
        )
    s_aa, s_bb, s_dd = totals.aa, totals.bb, totals.dd
    max_abs, max_at = totals.max_abs, totals.max_at
    violations, nonfinite = totals.violations, totals.nonfinite
    rel = s_dd / (s_aa + s_bb) if (s_aa + s_bb) > 0 else 0.0  # = 1 - 2Σab/Σ(a²+b²)
    shape = tuple(baseline.shape)
    at = _unravel(max_at, shape) if n else []
    return TensorDiff(
        shape=list(shape),
        dtypes=[
            str(baseline.dtype).removeprefix("torch."),
            str(candidate.dtype).removeprefix("torch."),
        ],
        numel=n,
        rel_diff=rel,
        max_abs=max(max_abs, 0.0),
        max_abs_at=at,
        baseline_at_max=float(a_flat[max_at]) if n else 0.0,
        candidate_at_max=float(b_flat[max_at]) if n else 0.0,
        mean_abs=totals.abs / n if n else 0.0,
        rmse=math.sqrt(s_dd / n) if n else 0.0,
        sqnr_db=10 * math.log10(s_aa / s_dd) if s_dd > 0 and s_aa > 0 else math.inf,
        violations=violations,
        rtol=rtol,
        atol=atol,
        nonfinite=nonfinite,
    )


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
        step = max(1, CHUNK // max(1, rows.shape[1]))
        for s in range(0, rows.shape[0], step):
            d = (rows_b[s : s + step].double() - rows[s : s + step].double()).abs()
            per_row[s : s + step] = d.nan_to_num(nan=math.inf).amax(dim=1)
    flat = per_pos.reshape(-1)
    values, idx = torch.topk(flat, min(k, flat.numel()))
    shape = tuple(per_pos.shape)
    return [(_unravel(int(i), shape), float(v)) for v, i in zip(values, idx, strict=True)]
