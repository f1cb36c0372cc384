"""Where an agent run's time goes: harness overhead per experiment, and the loop's own overhead.

    .venv/bin/python benchmarks/bench_overhead.py [--task decode-split-norm] [--budget 3] [--quick]
    .venv/bin/python benchmarks/bench_overhead.py --db runs.db --run RUN_ID   # an existing run

For each experiment: the share of its wall time spent in the sandbox setup, preparing the arms
(worker or server start), the correctness stage, the measurement itself, and the health stage
(from the experiment's recorded stage durations). For the run: the share of its wall time outside
experiments (policy, tools, checkpoints, store writes).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from infra_agent.store import open_store

STAGES = ("sandbox", "prepare", "correctness", "performance", "health")


def report(db: Path, run_id: str, wall_s: float | None) -> None:
    store = open_store(db, readonly=True)
    experiments = store.experiments(run_id)
    print(
        f"{'experiment':<18}{'total s':>8}"
        + "".join(f"{s:>13}" for s in STAGES)
        + f"{'overhead':>10}"
    )
    totals = dict.fromkeys(STAGES, 0.0)
    grand = 0.0
    for e in experiments:
        d = e.result.evidence.durations_s
        total = d.get("total", e.duration_s) or 1e-9
        grand += total
        shares = "".join(f"{d.get(s, 0.0) / total:>12.0%} " for s in STAGES)
        overhead = 1 - d.get("performance", 0.0) / total
        for s in STAGES:
            totals[s] += d.get(s, 0.0)
        print(f"{e.id:<18}{total:>8.1f}{shares}{overhead:>10.0%}")
    if experiments:
        print(
            "all experiments: measurement is "
            f"{totals['performance'] / grand:.0%} of experiment time; harness overhead "
            f"(sandbox + prepare + correctness + health) {1 - totals['performance'] / grand:.0%}"
        )
    run = store.get_run(run_id)
    if wall_s is None and run is not None:
        wall_s = (run.updated_at - run.created_at).total_seconds()  # first write to last
    if wall_s:
        print(
            f"run wall {wall_s:.1f} s; outside experiments (agent loop) {(wall_s - grand) / wall_s:.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="decode-split-norm")
    parser.add_argument("--budget", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--db", type=Path)
    parser.add_argument("--run")
    args = parser.parse_args()
    if args.db and args.run:
        report(args.db, args.run, None)
        return
    from bench_search import quick_copy  # type: ignore[import-not-found]

    from infra_agent.agent.configuration import RunConfig
    from infra_agent.agent.runner import start_run
    from infra_agent.agent.state import Budget
    from infra_agent.config import load_settings

    with tempfile.TemporaryDirectory() as tmp:
        task_ref = str(quick_copy(args.task, Path(tmp))) if args.quick else args.task
        db = Path(tmp) / "runs.db"
        settings = load_settings(overrides={"store.db": str(db)})
        t0 = time.perf_counter()
        outcome = start_run(
            RunConfig(task=task_ref, policy="search", budget=Budget(experiments=args.budget)),
            settings,
        )
        wall = time.perf_counter() - t0
        print(
            f"task {args.task}{' (quick)' if args.quick else ''}: run {outcome.run_id}, {len(outcome.experiments)} experiments"
        )
        report(db, outcome.run_id, wall)


if __name__ == "__main__":
    main()
