"""Export throughput: N synthetic trajectories from a real SQLite run store to each format.

Prints, in one run, rows/s of

- the full export (store -> trajectories -> validated rows -> file), per format and container;
- its stages: reading + building the trajectories (redaction, rewards, schema validation),
  turning them into rows, and writing the rows (validation + Arrow columns + Parquet);
- a plain `pyarrow.Table.from_pylist(rows)` + `pq.write_table` of the same rows,

so the writing stage can be compared with what Arrow alone costs. Usage:

    .venv/bin/python benchmarks/bench_export.py [--n 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
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
from infra_agent.trajectories.build import build_trajectory, load_run
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ROW_MODELS, ExportFormat, rl_row
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.writers import ParquetSink, arrow_table, atomic_file

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


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="Synthetic trajectories.")
    parser.add_argument("--keep", type=Path, default=None, help="Keep the store and outputs here.")
    parser.add_argument(
        "--jobs", type=int, default=4, help="Worker processes for the parallel run."
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        db = root / "runs.db"
        if db.exists():
            db.unlink()
        _, t_pop = timed(lambda: populate(db, args.n))
        print(f"store: {args.n} runs written in {t_pop:.1f} s ({db.stat().st_size / 1e6:.0f} MB)")
        store = open_store(db, readonly=True)
        redactor = Redactor.from_environment()

        print(f"\nfull export, {args.n} trajectories (store -> validated rows -> file):")
        for fmt in ExportFormat:
            for parquet in (False, True):
                out = root / f"{fmt.value}.{'parquet' if parquet else 'jsonl'}"
                start = time.perf_counter()
                summary = export_dataset(store, fmt, out, parquet=parquet, redactor=redactor)
                secs = time.perf_counter() - start
                print(f"  {fmt.value:10s} {'parquet' if parquet else 'jsonl':8s} {summary.rows / secs:8.0f} rows/s"
                      f"  ({secs:6.2f} s, {summary.bytes / 1e6:6.1f} MB)")  # fmt: skip

        out = root / "rl-jobs.parquet"
        summary, secs = timed(
            lambda: export_dataset(
                store, ExportFormat.RL, out, parquet=True, redactor=redactor, jobs=args.jobs
            )
        )
        print(
            f"  rl         parquet  {summary.rows / secs:8.0f} rows/s  ({secs:6.2f} s) with --jobs {args.jobs}"
        )

        print("\nstages of the rl/parquet export (one process):")
        runs = list(store.iter_runs())
        bundles, t_load = timed(lambda: [load_run(store, r) for r in runs])
        trajs, t_build = timed(lambda: [build_trajectory(b, redactor=redactor) for b in bundles])
        rows, t_rows = timed(lambda: [rl_row(t) for t in trajs])
        n = len(rows)
        ours_path, plain_path = root / "stage-ours.parquet", root / "stage-plain.parquet"
        adapter = __import__("pydantic").TypeAdapter(list[ROW_MODELS[ExportFormat.RL]])

        def ours() -> None:
            with atomic_file(ours_path) as f:
                sink = ParquetSink(f, arrow_table(ExportFormat.RL, rows[:1]).schema)
                for start in range(0, n, 512):
                    batch = rows[start : start + 512]
                    adapter.validate_python(batch)
                    sink.write(arrow_table(ExportFormat.RL, batch))
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
            t_ours.append(timed(ours)[1])
            t_plain.append(timed(plain)[1])
        best_ours, best_plain = min(t_ours), min(t_plain)
        print(f"  read store            {n / t_load:8.0f} rows/s ({t_load:6.2f} s)")
        print(
            f"  build trajectories    {n / t_build:8.0f} rows/s ({t_build:6.2f} s)  redaction, rewards, validation"
        )
        print(f"  trajectories -> rows  {n / t_rows:8.0f} rows/s ({t_rows:6.2f} s)")
        print(
            f"  write rows (ours)     {n / best_ours:8.0f} rows/s ({best_ours:6.2f} s)  validation + columns + zstd Parquet"
        )
        print(
            f"  write rows (plain)    {n / best_plain:8.0f} rows/s ({best_plain:6.2f} s)  Table.from_pylist + write_table"
        )
        print(f"  ours / plain write time: {best_ours / best_plain:.2f}x")
        total = t_load + t_build + t_rows + best_ours
        print(
            f"  share of export time in writing (ours): {best_ours / total:.0%}; in building: {t_build / total:.0%}"
        )


if __name__ == "__main__":
    main()
