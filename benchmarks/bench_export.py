"""Export throughput: N synthetic trajectories from a real SQLite run store to each format.

Prints, in one run, rows/s of

- the full export (store -> trajectories -> validated rows -> file), per format and container;
- its stages: reading + building the trajectories (redaction, rewards, schema validation),
  turning them into rows, and writing the rows (validation + Arrow columns + Parquet);
- a plain `pyarrow.Table.from_pylist(rows)` + `pq.write_table` of the same rows,

so the writing stage can be compared with what Arrow alone costs. Usage:

    .venv/bin/python benchmarks/bench_export.py [--n 10000] [--jobs N] [--all-formats] [--keep DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from infra_agent.experiments.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)
from infra_agent.store import open_store
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    PatchKind,
    PatchRecord,
    ProposalRecord,
    RunRecord,
    RunStatus,
    StepRecord,
    ToolCall,
)
from infra_agent.trajectories.build import ReviewIndex, build_trajectory, load_run
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ARROW_SCHEMAS, ExportFormat, rl_row
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.writers import ParquetSink, arrow_table, atomic_file, check_table

VERDICTS = [
    Verdict.IMPROVED,
    Verdict.NO_CHANGE,
    Verdict.INCORRECT,
    Verdict.REJECTED,
    Verdict.REGRESSED,
]


def populate(db: Path, n: int) -> None:
    """N runs of 12 messages (4 tool calls), 2 experiments, 1 proposal with a decision each."""
    store = open_store(db)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    with store.transaction():
        for i in range(n):
            at = t0 + timedelta(minutes=i)
            run = RunRecord(task=f"task-{i % 7}", objective="latency", policy="llm", model="glm-4.6",
                            status=RunStatus.FINISHED, config={"seed": i}, created_at=at)  # fmt: skip
            store.put_run(run)
            store.add_step(
                StepRecord(run_id=run.id, role="system", content="You are an infra engineer. " * 20)
            )
            store.add_step(
                StepRecord(run_id=run.id, role="user", content=f"Make task-{i % 7} faster.")
            )
            for k in range(4):
                args = json.dumps(
                    {"patch": f"p{k}.diff", "knobs": {"batch": 2**k, "mode": ["a", "b"][k % 2]}}
                )
                store.add_step(StepRecord(
                    run_id=run.id, role="assistant", content=f"Step {k}: trying a change.",
                    reasoning_content="The profile shows the norm recomputed per split. " * 5,
                    tool_calls=[ToolCall(id=f"c{k}", name="run_experiment", arguments=args)],
                    prompt_tokens=1000 + 200 * k, completion_tokens=80, cost_usd=0.001,
                ))  # fmt: skip
                store.add_step(StepRecord(run_id=run.id, role="tool", tool_call_id=f"c{k}", name="run_experiment",
                                          content="IMPROVED speedup 1.4x (95% CI 1.3-1.5)\n" + "log line\n" * 30))  # fmt: skip
            store.add_step(StepRecord(run_id=run.id, role="assistant", content="Done."))
            exp_ids = []
            for k in range(2):
                verdict = VERDICTS[(i + k) % len(VERDICTS)]
                patch = PatchRecord(
                    id=f"{i:032x}{k:032x}",
                    kind=PatchKind.DIFF,
                    diff="--- a/k.py\n+++ b/k.py\n" * 10,
                )
                store.put_patch(patch)
                result = ExperimentResult(
                    task=run.task, patch_id=patch.id, verdict=verdict, reasons=["measured"],
                    flags=[Flag.SUSPICIOUS] if i % 50 == 0 else [],
                    evidence=Evidence(
                        performance=PerformanceEvidence(
                            metric="latency_ms", unit="ms", higher_is_better=False, baseline_median=10,
                            candidate_median=7, speedup=1.4, ci_low=1.3, ci_high=1.5, n_samples=20,
                            baseline_samples=[10.0] * 20, candidate_samples=[7.0] * 20),
                        correctness=CorrectnessEvidence(passed=verdict is not Verdict.INCORRECT, checks=8),
                        health={"nan": 0}, extra={"layer": k},
                    ),
                )  # fmt: skip
                exp = ExperimentRecord(
                    run_id=run.id, task=run.task, patch_id=patch.id, result=result, started_at=at
                )
                store.put_experiment(exp)
                exp_ids.append(exp.id)
            prop = ProposalRecord(run_id=run.id, task=run.task, patch_id=f"{i:032x}{0:032x}",
                                  patch_hash=f"{i:032x}{0:032x}", experiment_ids=exp_ids[:1], created_at=at)  # fmt: skip
            store.put_proposal(prop)
            store.add_decision(DecisionRecord(proposal_id=prop.id, reviewer="alice", patch_hash=prop.patch_hash,
                                              action=DecisionAction.APPROVE if i % 3 else DecisionAction.REJECT))  # fmt: skip
    store.close()


def timed(fn: Any) -> tuple[Any, float, float]:
    """(value, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def line(label: str, n: int, wall: float, cpu: float | None, note: str = "") -> str:
    cpu_part = f"{n / cpu:8.0f} rows/CPU-s" if cpu else " " * 17
    return f"  {label:22s} {n / wall:8.0f} rows/s  {cpu_part}  ({wall:6.2f} s)  {note}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="Synthetic trajectories.")
    parser.add_argument("--keep", type=Path, default=None, help="Keep the store and outputs here.")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="Workers, parallel run."
    )
    parser.add_argument(
        "--all-formats", action="store_true", help="Full export in all six formats."
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        db = root / "runs.db"
        if db.exists():
            db.unlink()
        _, t_pop, _ = timed(lambda: populate(db, args.n))
        print(f"store: {args.n} runs written in {t_pop:.1f} s ({db.stat().st_size / 1e6:.0f} MB)")
        store = open_store(db, readonly=True)
        redactor = Redactor.from_environment()

        print(f"\nfull export, {args.n} trajectories (store -> validated rows -> file):")
        kinds = (
            [(f, p) for f in ExportFormat for p in (False, True)]
            if args.all_formats
            else [(ExportFormat.RL, True)]
        )
        for fmt, parquet in kinds:
            out = root / f"{fmt.value}.{'parquet' if parquet else 'jsonl'}"
            job = functools.partial(
                export_dataset, store, fmt, out, parquet=parquet, redactor=redactor
            )
            summary, wall, cpu = timed(job)
            label = f"{fmt.value} {'parquet' if parquet else 'jsonl'}"
            print(line(label, summary.rows, wall, cpu, f"{summary.bytes / 1e6:.1f} MB"))
        if args.jobs > 1:
            out = root / "rl-jobs.parquet"
            summary, wall, _ = timed(
                lambda: export_dataset(
                    store, ExportFormat.RL, out, parquet=True, redactor=redactor, jobs=args.jobs
                )
            )
            print(
                line(
                    f"rl parquet --jobs {args.jobs}",
                    summary.rows,
                    wall,
                    None,
                    "(workers' CPU not counted)",
                )
            )

        print("\nstages of the rl/parquet export (one process):")
        t_build = t_rows = c_build = c_rows = 0.0
        rows = []
        review, t_load, c_load = timed(lambda: ReviewIndex(store))
        for run in store.iter_runs():
            bundle, w, c = timed(lambda: load_run(store, run, review))  # noqa: B023
            t_load, c_load = t_load + w, c_load + c
            traj, w, c = timed(lambda: build_trajectory(bundle, redactor=redactor))  # noqa: B023
            t_build, c_build = t_build + w, c_build + c
            row, w, c = timed(lambda: rl_row(traj))  # noqa: B023
            t_rows, c_rows = t_rows + w, c_rows + c
            rows.append(row)
        n = len(rows)
        ours_path, plain_path = root / "stage-ours.parquet", root / "stage-plain.parquet"

        def ours() -> None:
            with atomic_file(ours_path) as f:
                sink = ParquetSink(f, ARROW_SCHEMAS[ExportFormat.RL])
                for start in range(0, n, 512):
                    table = arrow_table(ExportFormat.RL, rows[start : start + 512])
                    check_table(ExportFormat.RL, table)
                    sink.write(table)
                sink.close()

        flat = [
            {**{k: v for k, v in r.items() if k != "tools"}, "tools_json": json.dumps(r["tools"])}
            for r in rows
        ]

        def plain() -> None:
            pq.write_table(pa.Table.from_pylist(flat), plain_path, compression="zstd")

        # Interleave the two writers and keep the best of 3 each (the machine is shared).
        t_ours, t_plain = [], []
        for _ in range(3):
            t_ours.append(timed(ours)[1:])
            t_plain.append(timed(plain)[1:])
        (w_ours, c_ours), (w_plain, c_plain) = min(t_ours), min(t_plain)
        print(line("read store", n, t_load, c_load))
        print(
            line("build trajectories", n, t_build, c_build, "redaction, rewards, schema validation")
        )
        print(line("trajectories -> rows", n, t_rows, c_rows))
        print(
            line(
                "write rows (ours)",
                n,
                w_ours,
                c_ours,
                "typed columns + column checks + zstd Parquet",
            )
        )
        print(
            line(
                "write rows (plain)", n, w_plain, c_plain, "Table.from_pylist + write_table (zstd)"
            )
        )
        print(
            f"  ours / plain write time: {w_ours / w_plain:.2f}x wall, {c_ours / c_plain:.2f}x CPU"
        )
        total = c_load + c_build + c_rows + c_ours
        print(f"  CPU share of a one-process export: read {c_load / total:.0%}, build {c_build / total:.0%}, "
              f"rows {c_rows / total:.0%}, write {c_ours / total:.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
