"""Throughput of the accuracy diff next to a plain `(a - b).abs().max()` pass, same tensors.

    .venv/bin/python benchmarks/bench_feedback_accuracy.py [--quick] [--gib 1.0]

`tensor_diff` computes rel diff, max/mean abs (with location), RMSE, SQNR and the tolerance
violation count in one chunked pass. Prints the median time of each over a few interleaved
repetitions and the ratio plain/ours (target >= 0.5).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from infra_agent.feedback.accuracy import tensor_diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB per tensor, 3 repetitions")
    parser.add_argument("--gib", type=float, default=1.0, help="size of each tensor, GiB")
    args = parser.parse_args()
    gib = 0.25 if args.quick else args.gib
    reps = 3 if args.quick else 5
    n = int(gib * (1 << 30)) // 4
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=g)
    b = a + 1e-3 * torch.randn(n, generator=g)
    plain, ours = [], []
    for _ in range(reps):
        t = time.perf_counter()
        (a - b).abs().max()
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        d = tensor_diff(a, b)
        ours.append(time.perf_counter() - t)
    p, o = statistics.median(plain), statistics.median(ours)
    gb = 2 * n * 4 / 1e9
    print(f"tensors: 2 x {gib:g} GiB float32, {torch.get_num_threads()} torch threads, {reps} reps")
    print(f"plain (a-b).abs().max(): {p:.3f} s ({gb / p:.2f} GB/s read)")
    print(f"tensor_diff:             {o:.3f} s ({gb / o:.2f} GB/s read)")
    print(f"throughput ratio ours/plain = {p / o:.2f} (target >= 0.5)")
    print(f"(result: rel {d.rel_diff:.3e}, max {d.max_abs:.3g} at {d.max_abs_at}, "
          f"{d.violations} violations)")  # fmt: skip


if __name__ == "__main__":
    main()
