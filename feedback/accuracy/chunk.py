"""The fused chunked pass behind `tensor_diff`: every metric of one chunk from one `b - a`.

Per chunk (a = baseline, b = candidate, d = b - a, all in the work dtype):
`Σa², Σb², Σd²`, `Σ|d|`, `max|d|`, and, only when max|d| > atol, the count of
|d| > atol + rtol·|a|. Element-wise work reuses per-thread scratch buffers (no allocation per
chunk). A chunk whose sums are not finite (NaN/inf inside, or float32 overflow) is redone in
float64 on the slow path, which leaves non-finite elements out of the sums and counts them.

`run_chunks` hands chunks to a few Python threads from a shared counter and keeps each chunk's
numbers by chunk index; they are added in chunk order in float64 at the end.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

CHUNK = (1 << 15) - 64
"""Elements per chunk (32704: 128 KB per float32 buffer). A chunk's a, b and two scratch buffers
fit in a core's L2 cache (512 KB here), and every op stays just below torch's parallel grain
(32768 elements), so it runs on the calling thread instead of waking the OpenMP pool: on a busy
machine each such wake-up can wait a scheduler time slice for a descheduled pool thread."""

DEVICE_CHUNK = 1 << 24
"""Elements per chunk on a GPU: each chunk costs a few host syncs, not cache misses."""

MIN_PER_THREAD = 1 << 20
"""Elements per extra thread at least (starting one costs ~100 µs)."""

MAX_THREADS = 4
"""Python threads at most: each op holds the GIL for a few µs of its ~10 µs, so more threads
would only queue for it."""

TINY = 2.0**-60
"""A float32 sum of squares below this may have lost squares to underflow (each under 2^-126)."""

EXACT_COUNT = 1 << 24
"""A float32 sum of 0/1 flags is exact up to this many elements."""

_Row = tuple[float, float, float, float, float, int, int]
"""One chunk's (Σa², Σb², Σd², Σ|d|, max|d|, violations, nonfinite)."""


@dataclass
class ChunkSums:
    """Totals over all chunks (sums in float64) and the flat index of the largest |d|."""

    aa: float
    bb: float
    dd: float
    abs: float
    max_abs: float
    max_at: int
    violations: int
    nonfinite: int


class _Scratch:
    """Chunk-sized buffers for one thread, reused for every chunk it takes."""

    def __init__(self, chunk: int, work: torch.dtype, device: torch.device, atol: float) -> None:
        self.work = work
        self.a = torch.empty(chunk, dtype=work, device=device)
        self.b = torch.empty(chunk, dtype=work, device=device)
        self.d = torch.empty(chunk, dtype=work, device=device)
        self.tol = torch.empty(chunk, dtype=work, device=device)
        self.atol = torch.tensor(atol, dtype=work, device=device)


def work_dtype(a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
    """float32 for float32/16-bit inputs (both convert exactly), float64 when either is."""
    if torch.float64 in (a.dtype, b.dtype) or not (a.is_floating_point() and b.is_floating_point()):
        return torch.float64
    return torch.float32


def _in_work(x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    if x.dtype == buffer.dtype:
        return x
    return buffer[: x.numel()].copy_(x)


def _square_sum(x: torch.Tensor, scratch: torch.Tensor) -> float:
    """Σx² of one chunk as a Python float: a cascade sum of the squares (as accurate as
    `torch.sum`; a vectorized norm or BLAS dot accumulates lane by lane and, on mixed
    magnitudes, loses small squares: 5e-5 relative was seen; MKL's dot also wakes its own
    thread pool). A float32 sum below `TINY` is redone in float64: squares of values under
    ~1e-19 are denormal or zero in float32."""
    total = float(torch.mul(x, x, out=scratch[: x.numel()]).sum())
    if total < TINY and x.dtype == torch.float32:
        total = float(torch.square(x.double()).sum())
    return total


def diff_chunk(
    s: _Scratch, a_in: torch.Tensor, b_in: torch.Tensor, rtol: float, atol: float
) -> tuple[_Row, torch.Tensor]:
    """One chunk's numbers, and |d| (non-finite disagreements as inf) for locating the max.

    Element-wise work runs in the inputs' precision (float32 for float32 and 16-bit inputs:
    b - a of two nearby floats is exact, Sterbenz) with cascade sums over at most a chunk; the
    caller adds chunks in float64.
    """
    work = s.work
    n = a_in.numel()
    a, b = _in_work(a_in, s.a), _in_work(b_in, s.b)
    d = torch.sub(b, a, out=s.d[:n])
    aa, bb, dd = _square_sum(a, s.tol), _square_sum(b, s.tol), _square_sum(d, s.tol)
    nonfinite = 0
    if not (math.isfinite(aa) and math.isfinite(bb) and math.isfinite(dd)):
        # Slow path, only for chunks holding NaN/inf (or float32 overflow): equal infinities
        # count as equal, any other non-finite element as a violation; the sums skip them.
        a = a_in.to(torch.float64, copy=True)
        b = b_in.to(torch.float64, copy=True)
        both = torch.isfinite(a) & torch.isfinite(b)
        bad = ~both & (a != b)
        nonfinite = int(bad.sum())
        a = torch.where(both, a, 0.0)
        b = torch.where(both, b, 0.0)
        d = b - a
        aa, bb, dd = (float(torch.square(x).sum()) for x in (a, b, d))
        d.abs_()
        sum_abs = float(d.sum())
        d = torch.where(bad, math.inf, d)
    else:
        d.abs_()
        sum_abs = float(d.sum())
    m = float(d.max())
    violations = 0
    if m > atol and a.dtype != work:  # slow path: float64 copies
        violations = int(torch.count_nonzero(d > a.abs().mul_(rtol).add_(atol)))
    elif m > atol:  # otherwise nothing can be out of tolerance
        tol = torch.abs(a, out=s.tol[:n])
        torch.add(s.atol, tol, alpha=rtol, out=tol)  # atol + rtol·|a| in one pass
        outside = torch.gt(d, tol, out=tol)  # 1.0 / 0.0: a float kernel, 2x a bool one
        violations = int(outside.sum() if n <= EXACT_COUNT else torch.count_nonzero(outside))
    return (aa, bb, dd, sum_abs, m, violations, nonfinite), d


def run_chunks(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    rtol: float,
    atol: float,
    chunk: int = CHUNK,
    threads: int | None = None,
) -> ChunkSums:
    """All chunks of the flat tensors `a`, `b` (same numel), on up to `threads` threads."""
    n = a.numel()
    count = -(-n // chunk)
    work = work_dtype(a, b)
    size = min(chunk, max(n, 1))
    wanted = threads if threads is not None else torch.get_num_threads()
    if a.device.type != "cpu":
        wanted = 1  # one stream of device ops; Python threads would only contend
    wanted = max(1, min(wanted, MAX_THREADS, n // MIN_PER_THREAD))
    rows: list[_Row | None] = [None] * count
    claim = threading.Lock()
    next_chunk = [0]
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker() -> None:
        scratch = _Scratch(size, work, a.device, atol)
        try:
            while not stop.is_set():
                with claim:
                    i = next_chunk[0]
                    next_chunk[0] = i + 1
                if i >= count:
                    return
                lo = i * chunk
                rows[i] = diff_chunk(scratch, a[lo : lo + chunk], b[lo : lo + chunk], rtol, atol)[0]
        except BaseException as exc:  # surfaced by the calling thread
            errors.append(exc)
            stop.set()

    helpers = [threading.Thread(target=worker, daemon=True) for _ in range(wanted - 1)]
    for t in helpers:
        t.start()
    try:
        worker()
    finally:
        stop.set()  # after the calling thread's share, or on Ctrl-C / an error: helpers stop
        for t in helpers:
            t.join()
    if errors:
        raise errors[0]
    done = [r for r in rows if r is not None]
    if len(done) != count:
        raise RuntimeError(f"accuracy diff: {count - len(done)} chunks were not processed")
    return _combine(done, a, b, rtol, atol, chunk, size, work)


def _combine(
    rows: list[_Row],
    a: torch.Tensor,
    b: torch.Tensor,
    rtol: float,
    atol: float,
    chunk: int,
    size: int,
    work: torch.dtype,
) -> ChunkSums:
    """Chunk rows added in chunk order; the max located by re-running its chunk."""
    aa = bb = dd = sum_abs = 0.0
    violations = nonfinite = 0
    max_abs, best = -1.0, 0
    for i, (r_aa, r_bb, r_dd, r_abs, r_max, r_viol, r_nonfinite) in enumerate(rows):
        aa += r_aa
        bb += r_bb
        dd += r_dd
        sum_abs += r_abs
        violations += r_viol
        nonfinite += r_nonfinite
        if r_max > max_abs:
            max_abs, best = r_max, i
    max_at = 0
    if rows:
        lo = best * chunk
        scratch = _Scratch(size, work, a.device, atol)
        _, d = diff_chunk(scratch, a[lo : lo + chunk], b[lo : lo + chunk], rtol, atol)
        max_at = lo + int(torch.argmax(d))
    return ChunkSums(aa, bb, dd, sum_abs, max_abs, max_at, violations, nonfinite)
