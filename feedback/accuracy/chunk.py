"""The fused chunked pass behind `tensor_diff`: every metric of one chunk from one `b - a`.

Per chunk (a = baseline, b = candidate, d = b - a, all in the work dtype): `Σa², Σb², Σd²`,
`Σ|d|`, `max|d|`, max |d|/ulp(a) (ulp.py), and, only when max|d| > atol, the count of
|d| > atol + rtol·|a|: 18 ops, each over the cache-resident chunk. Element-wise work reuses per-thread scratch buffers (no allocation per
chunk). A chunk whose sums are not finite (NaN/inf inside, or float32 overflow) is redone in
float64 on the slow path, which leaves non-finite elements out of the sums and counts them.

`run_chunks` hands chunks to a few worker threads from a shared counter (torch ops release the
GIL) and keeps each chunk's numbers by chunk index; they are added in chunk order in float64 at
the end, so the result does not depend on the number of threads. Each worker runs its ops on one
OpenMP thread (`torch.set_num_threads(1)` inside the worker; with torch's OpenMP backend the
setting is per thread, the caller's stays as it was): the small ops of a chunk on a 2-thread
OpenMP pool each wait at a barrier, and on a busy machine that wait is a scheduler time slice
whenever the other pool thread is descheduled (measured: 2-3x slower than one thread). Threads
that make their first torch call while a diff runs start with one thread too, and with a
non-OpenMP torch build the setting is process-wide until the diff ends; it is restored after.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

from infra_agent.feedback.accuracy.ulp import max_ulp, ulp_dtype, ulp_scale

CHUNK = 1 << 17
"""Elements per chunk on CPU (131072: 512 KB per float32 buffer). After the first read of a and b
from memory, every other pass over the chunk hits the cache (a, b, d and one scratch buffer: 2 MB
per worker, within an 8 MB L3), and each op is long enough (~50 µs) to hide the few µs of Python
and dispatch it costs. Measured on the 2-core CI machine (CPU time per element, one worker):
16K-element chunks 14 ns, 32K 9.4 ns, 64K 7.2 ns, 128K 6.6 ns; 256K fall out of the cache."""

DEVICE_CHUNK = 1 << 24
"""Elements per chunk on a GPU: each chunk costs a few host syncs, not cache misses."""

MIN_PER_THREAD = 1 << 20
"""Elements per worker thread at least (starting one costs ~100 µs)."""

MAX_THREADS = 4
"""Worker threads at most: each op holds the GIL for a few µs of its ~50 µs."""

TINY = 2.0**-60
"""A float32 sum of squares below this may have lost squares to underflow (each under 2^-126)."""

EXACT_COUNT = 1 << 24
"""A float32 sum of 0/1 flags is exact up to this many elements."""

_INT = {torch.float32: torch.int32, torch.float64: torch.int64}

_Row = tuple[float, float, float, float, float, float, int, int]
"""One chunk's (Σa², Σb², Σd², Σ|d|, max|d|, max ulps, violations, nonfinite)."""


@dataclass
class ChunkSums:
    """Totals over all chunks (sums in float64) and the flat index of the largest |d|."""

    aa: float
    bb: float
    dd: float
    abs: float
    max_abs: float
    max_at: int
    max_ulp: float | None
    violations: int
    nonfinite: int


class _Scratch:
    """Chunk-sized buffers for one thread, reused for every chunk it takes."""

    def __init__(
        self,
        chunk: int,
        work: torch.dtype,
        device: torch.device,
        atol: float,
        ulp: torch.dtype | None,
    ) -> None:
        self.work = work
        self.ulp = ulp_scale(work, ulp) if ulp is not None else None
        self.ulp_of = ulp
        self.size = chunk
        self.a = torch.empty(chunk, dtype=work, device=device)
        self.b = torch.empty(chunk, dtype=work, device=device)
        self.d = torch.empty(chunk, dtype=work, device=device)
        self.tol = torch.empty(chunk, dtype=work, device=device)
        self.atol = torch.tensor(atol, dtype=work, device=device)
        self.bits = torch.empty(chunk, dtype=_INT[work], device=device)


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
    total = float(torch.mul(x, x, out=scratch).sum())
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
    full = n == s.size  # every chunk but a ragged last one: no views to make (each costs µs)
    t = s.tol if full else s.tol[:n]
    a, b = _in_work(a_in, s.a), _in_work(b_in, s.b)
    d = torch.sub(b, a, out=s.d if full else s.d[:n])
    aa, bb, dd = _square_sum(a, t), _square_sum(b, t), _square_sum(d, t)
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
    ulps = 0.0
    if s.ulp_of is not None and m > 0:
        if a.dtype != work:  # slow path: float64 values
            ulps = max_ulp(d, a, ulp_scale(torch.float64, s.ulp_of))
        else:
            assert s.ulp is not None  # set whenever ulp_of is
            ulps = max_ulp(d, a, s.ulp, s.bits if full else s.bits[:n], t)
    violations = 0
    if m > atol and a.dtype != work:  # slow path: float64 copies
        violations = int(torch.count_nonzero(d > a.abs().mul_(rtol).add_(atol)))
    elif m > atol:  # otherwise nothing can be out of tolerance
        tol = torch.abs(a, out=t)
        torch.add(s.atol, tol, alpha=rtol, out=tol)  # atol + rtol·|a| in one pass
        outside = torch.gt(d, tol, out=tol)  # 1.0 / 0.0: a float kernel, 2x a bool one
        violations = int(outside.sum() if n <= EXACT_COUNT else torch.count_nonzero(outside))
    return (aa, bb, dd, sum_abs, m, ulps, violations, nonfinite), d


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
    ulp_of = ulp_dtype(a.dtype, b.dtype)
    size = min(chunk, max(n, 1))
    wanted = threads if threads is not None else torch.get_num_threads()
    wanted = max(1, min(wanted, MAX_THREADS, n // MIN_PER_THREAD))
    rows: list[_Row | None] = [None] * count
    claim = threading.Lock()
    next_chunk = [0]
    stop = threading.Event()
    errors: list[BaseException] = []
    caller_threads = torch.get_num_threads()

    def worker(one_omp_thread: bool) -> None:
        if one_omp_thread:
            torch.set_num_threads(1)  # this thread's OpenMP setting (see module doc)
        try:
            scratch = _Scratch(size, work, a.device, atol, ulp_of)
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
        finally:
            if one_omp_thread:  # the global default new threads start from, as it was
                torch.set_num_threads(caller_threads)

    if a.device.type != "cpu":
        worker(False)  # in the caller's thread: its current device stream
    else:
        pool = [threading.Thread(target=worker, args=(True,), daemon=True) for _ in range(wanted)]
        for t in pool:
            t.start()
        try:
            for t in pool:
                t.join()
        finally:
            stop.set()  # on Ctrl-C in the caller: workers stop after their current chunk
            for t in pool:
                t.join()
    if errors:
        raise errors[0]
    done = [r for r in rows if r is not None]
    if len(done) != count:
        raise RuntimeError(f"accuracy diff: {count - len(done)} chunks were not processed")
    return _combine(done, a, b, rtol, atol, chunk, _Scratch(size, work, a.device, atol, ulp_of))


def _combine(
    rows: list[_Row],
    a: torch.Tensor,
    b: torch.Tensor,
    rtol: float,
    atol: float,
    chunk: int,
    scratch: _Scratch,
) -> ChunkSums:
    """Chunk rows added in chunk order; the max located by re-running its chunk."""
    aa = bb = dd = sum_abs = 0.0
    violations = nonfinite = 0
    max_abs, best, ulps = -1.0, 0, 0.0
    for i, (r_aa, r_bb, r_dd, r_abs, r_max, r_ulp, r_viol, r_nonfinite) in enumerate(rows):
        aa += r_aa
        bb += r_bb
        dd += r_dd
        sum_abs += r_abs
        violations += r_viol
        nonfinite += r_nonfinite
        ulps = max(ulps, r_ulp)
        if r_max > max_abs:
            max_abs, best = r_max, i
    max_at = 0
    if rows:
        lo = best * chunk
        _, d = diff_chunk(scratch, a[lo : lo + chunk], b[lo : lo + chunk], rtol, atol)
        max_at = lo + int(torch.argmax(d))
    ulp_of = ulp_dtype(a.dtype, b.dtype)
    return ChunkSums(
        aa, bb, dd, sum_abs, max_abs, max_at, ulps if ulp_of else None, violations, nonfinite
    )
