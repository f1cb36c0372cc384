"""Wall time of a batch of CPU experiments with the local and the Ray executor, side by side.

    .venv/bin/python benchmarks/bench_executors.py [--batch 8] [--task example-matmul]

Prints, for each executor configuration, the batch wall time, its ratio to local x1, and the
per-experiment overhead (wall time not spent inside the experiment: process or Ray task start,
imports, transfer; for Ray it also includes time queued, which Ray does not report apart). All configurations run in one invocation on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from infra_agent.experiments.executors import ExperimentRequest, create_executor, run_batch
from infra_agent.tasks.patch import load_patch
from infra_agent.tasks.registry import find_task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--task", default="example-matmul")
    args = parser.parse_args()
    task = find_task(args.task)
    assert task.reference_patch is not None, f"{args.task} has no reference patch"
    patch = load_patch(task.reference_patch)
    requests = [
        ExperimentRequest(id=f"e{i}", task=args.task, patch=patch) for i in range(args.batch)
    ]

    rows: list[tuple[str, float, float, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        configs = [
            ("local x1", lambda: create_executor("local", parallel=1)),
            ("local x2 (1 core each)", lambda: create_executor("local", parallel=2)),
            ("ray (local cluster)", lambda: create_executor("ray", temp_dir=Path(tmp) / "ray")),
        ]
        for label, make in configs:
            t0 = time.perf_counter()
            executor = make()
            setup = time.perf_counter() - t0
            t1 = time.perf_counter()
            outcomes = run_batch(executor, requests)
            wall = time.perf_counter() - t1
            executor.shutdown()
            overhead = statistics.median(o.overhead_s for o in outcomes)
            verdicts = ",".join(sorted({o.record.result.verdict.value for o in outcomes}))
            rows.append((f"{label} (+{setup:.1f}s start)", wall, overhead, verdicts))

    base = rows[0][1]
    print(f"batch of {args.batch} experiments on {args.task}")
    print(f"{'executor':40} {'wall s':>8} {'vs local x1':>12} {'overhead/exp s':>15}  verdicts")
    for label, wall, overhead, verdicts in rows:
        print(f"{label:40} {wall:8.1f} {base / wall:11.2f}x {overhead:15.2f}  {verdicts}")


if __name__ == "__main__":
    main()
