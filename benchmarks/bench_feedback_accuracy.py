"""Throughput of the accuracy diff next to a plain `(a - b).abs().max()` pass, same tensors.

    .venv/bin/python benchmarks/bench_feedback_accuracy.py [--quick] [--gib 1.0] [--reps 5]

"1 GiB of float32 tensors" is read as the input size: a and b are 512 MiB each (2 x 128 Mi
elements), b = a + 1e-3·noise, so nearly every chunk has tolerance violations to count (the
slowest case of `tensor_diff`). `tensor_diff` computes rel diff, max/mean abs (with location),
RMSE, SQNR, max ULP distance, the tolerance violation count and NaN/inf handling in one chunked
pass.

Each repetition times both, alternating which goes first (ABBA), and prints its ratio
plain/ours (throughput of ours as a fraction of plain; target >= 0.5); the summary gives the
ratio of the medians and whether the target is met. Peak memory: the inputs plus the plain
pass's two full-size temporaries.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from infra_agent.feedback.accuracy import tensor_diff

TARGET = 0.5


def _plain(a: torch.Tensor, b: torch.Tensor) -> float:
    t = time.perf_counter()
    float((a - b).abs().max())
    return time.perf_counter() - t


def _ours(a: torch.Tensor, b: torch.Tensor) -> float:
    t = time.perf_counter()
    tensor_diff(a, b)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="0.25 GiB in all, 3 repetitions")
    parser.add_argument("--gib", type=float, default=1.0, help="both tensors together, GiB")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 5, quick 3)")
    args = parser.parse_args()
    gib = 0.25 if args.quick else args.gib
    reps = args.reps or (3 if args.quick else 5)
    n = int(gib * (1 << 30)) // 8  # elements per tensor: two float32 tensors of gib/2 each
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=g)
    b = a + 1e-3 * torch.randn(n, generator=g)
    gb = 2 * n * 4 / 1e9
    print(
        f"tensors: 2 x {gib / 2:g} GiB float32 ({n} elements each), "
        f"{torch.get_num_threads()} torch threads, {reps} reps, ABBA order"
    )
    _ours(a[: 1 << 20], b[: 1 << 20])  # warm-up: thread start, first allocations
    plain, ours = [], []
    for rep in range(reps):
        if rep % 2 == 0:
            p, o = _plain(a, b), _ours(a, b)
        else:
            o, p = _ours(a, b), _plain(a, b)
        plain.append(p)
        ours.append(o)
        print(f"  rep {rep}: plain {p:.3f} s  tensor_diff {o:.3f} s  ratio {p / o:.2f}")
    p, o = statistics.median(plain), statistics.median(ours)
    ratio = p / o
    print(f"plain (a-b).abs().max(): {p:.3f} s median ({gb / p:.2f} GB/s read)")
    print(f"tensor_diff:             {o:.3f} s median ({gb / o:.2f} GB/s read)")
    verdict = "met" if ratio >= TARGET else "NOT met"
    print(f"throughput ratio ours/plain = {ratio:.2f} (target >= {TARGET}: {verdict})")
    d = tensor_diff(a, b)
    print(f"(result: rel {d.rel_diff:.3e}, max {d.max_abs:.3g} at {d.max_abs_at}, "
          f"{d.max_ulp:.3g} ulps, {d.violations} violations)")  # fmt: skip


if __name__ == "__main__":
    main()
