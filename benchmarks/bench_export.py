"""Export throughput: N synthetic trajectories from a real SQLite run store to Parquet.

For rl and openai-sft, prints side by side (interleaved, best of --repeat) rows/s and CPU of

- the full export (store -> trajectories -> rows -> redacted, validated Parquet file), as
  `infra-agent export --parquet` runs it, and
- a plain `pyarrow.Table.from_pylist(rows)` + `pq.write_table` (zstd) of the same rows,

and the ratio of the two CPU times (goal: the full export within 3x the plain write's CPU);
then, for one format, where a one-process export spends its CPU (per-phase, through the
exporter's own functions) and, unless --no-profile, cProfile's top functions. Usage:

    .venv/bin/python benchmarks/bench_export.py [--n 10000] [--jobs N] [--all-formats] [--keep DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from infra_agent.redact import Redactor
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
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)
from infra_agent.trajectories.arrow import read_rows, to_table
from infra_agent.trajectories.build import ReviewIndex, build_trajectory, load_runs
from infra_agent.trajectories.export import BATCH_ROWS, export_dataset
from infra_agent.trajectories.formats import FORMATS, ExportFormat
from infra_agent.trajectories.writers import ParquetSink, atomic_file, check_table

VERDICTS = [
    Verdict.IMPROVED,
    Verdict.NO_CHANGE,
    Verdict.INCORRECT,
    Verdict.REJECTED,
    Verdict.REGRESSED,
]


def populate(db: Path, n: int) -> None:
    """N runs of 12 messages (4 tool calls), 2 experiments, 1 proposal with a decision each.
    The system prompt is the same in every run; the other texts differ from run to run (batch
    redaction gates each distinct string once, so repeated texts would flatter it)."""
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
            store.add_step(StepRecord(run_id=run.id, role="user",
                                      content=f"Make task-{i % 7} faster (ticket {i})."))  # fmt: skip
            for k in range(4):  # text differs from run to run, as a real agent's does
                args = json.dumps(
                    {"patch": f"p{i}-{k}.diff", "knobs": {"batch": 2**k, "mode": ["a", "b"][k % 2]}}
                )
                log = "".join(f"[{i}.{k}.{j}] step {(i * 31 + j) % 997} us\n" for j in range(24))
                store.add_step(StepRecord(
                    run_id=run.id, role="assistant", content=f"Step {k} of run {i}: batch {2**k}.",
                    reasoning_content=f"Run {i}: the norm is recomputed per split ({i % 89} us). " * 4,
                    tool_calls=[ToolCall(id=f"c{k}", name="run_experiment", arguments=args)],
                    prompt_tokens=1000 + 200 * k, completion_tokens=80, cost_usd=0.001,
                ))  # fmt: skip
                store.add_step(StepRecord(run_id=run.id, role="tool", tool_call_id=f"c{k}", name="run_experiment",
                                          content=f"IMPROVED speedup 1.{(i + k) % 9}x\n" + log))  # fmt: skip
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
    return f"  {label:34s} {n / wall:8.0f} rows/s  {cpu_part}  ({wall:6.2f} s)  {note}"


def phases(store: Any, redactor: Redactor, fmt: ExportFormat) -> list[tuple[str, float, float]]:
    """CPU and wall seconds of each phase of a one-process export, batch by batch through the
    exporter's own functions: read the store's records, build the trajectories, make the rows,
    the typed table, redaction, checks, Parquet writing."""
    totals: dict[str, list[float]] = {}
    form = FORMATS[fmt]

    def run(name: str, fn: Any) -> Any:
        value, wall, cpu = timed(fn)
        acc = totals.setdefault(name, [0.0, 0.0])
        acc[0] += wall
        acc[1] += cpu
        return value

    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "x.parquet", "wb") as f:
        sink = ParquetSink(f, form.schema)
        runs = run("read store", lambda: list(store.iter_runs()))
        review = run("read store", lambda: ReviewIndex(store))
        for start in range(0, len(runs), BATCH_ROWS):
            chunk = runs[start : start + BATCH_ROWS]
            bundles = run("read store", lambda: load_runs(store, chunk, review))  # noqa: B023
            trajectories = run("trajectories", lambda: [build_trajectory(b) for b in bundles])  # noqa: B023
            rows = run("rows", lambda: [form.row(t) for t in trajectories if t.steps])  # noqa: B023
            table = run("typed table", lambda: to_table(rows, form.schema))  # noqa: B023
            table = run("redaction", lambda: redactor.table(table))  # noqa: B023
            run("checks", lambda: check_table(fmt, table))  # noqa: B023
            run("Parquet write (zstd)", lambda: sink.write(table))  # noqa: B023
        run("Parquet write (zstd)", sink.finish)
        sink.close()
    return [(name, wall, cpu) for name, (wall, cpu) in totals.items()]


def profile_top(job: Any, n: int = 12) -> list[str]:
    """The `n` functions with the most own time in one run of `job` (cProfile)."""
    profiler = cProfile.Profile()
    profiler.runcall(job)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(n)
    text = out.getvalue().splitlines()
    start = next(i for i, t in enumerate(text) if t.strip().startswith("ncalls"))
    return [t.replace(str(Path.cwd()) + "/", "") for t in text[start : start + n + 1]]


CHAT_FORMATS = (ExportFormat.RL, ExportFormat.OPENAI_SFT)


def store_rows(store: Any) -> int:
    return sum(1 for _ in store.iter_runs())


def compare(store: Any, redactor: Redactor, fmt: ExportFormat, root: Path, repeat: int) -> float:
    """Print the side-by-side lines of `fmt`/parquet; returns the plain write's best CPU seconds."""
    out = root / f"{fmt.value}.parquet"

    def export() -> Any:
        return export_dataset(store, fmt, out, parquet=True, redactor=redactor)

    summary = export()
    rows = read_rows(out)  # the rows the export wrote
    form, n = FORMATS[fmt], len(rows)
    ours_path, plain_path = root / f"ours-{fmt.value}.parquet", root / f"plain-{fmt.value}.parquet"

    def ours() -> None:  # the exporter's writer: typed table, redaction, checks, zstd
        with atomic_file(ours_path) as f:
            sink = ParquetSink(f, form.schema)
            for start in range(0, n, BATCH_ROWS):
                table = redactor.table(to_table(rows[start : start + BATCH_ROWS], form.schema))
                check_table(fmt, table)
                sink.write(table)
            sink.finish()
            sink.close()

    # Plain pyarrow infers the types; a tool's JSON schema differs from tool to tool, so the
    # tool list goes in as JSON text, as one would write it without a schema.
    flat = [r | {"tools": json.dumps(r["tools"])} for r in rows]

    def plain() -> None:
        pq.write_table(pa.Table.from_pylist(flat), plain_path, compression="zstd")

    # Interleave the three and keep each one's best of `repeat` (the machine is shared), all
    # without cyclic GC, as the export runs.
    best: dict[str, tuple[float, float]] = {}
    gc.disable()
    for _ in range(repeat):
        for name, job in [("export", export), ("ours", ours), ("plain", plain)]:
            _, wall, cpu = timed(job)
            best[name] = min(best.get(name, (wall, cpu)), (wall, cpu))
    gc.enable()
    assert ours_path.read_bytes() == out.read_bytes()
    (w_exp, c_exp), (w_ours, c_ours), (w_plain, c_plain) = (
        best["export"],
        best["ours"],
        best["plain"],
    )
    print(f"\n{fmt.value}/parquet, {n} trajectories, best of {repeat} interleaved:")
    print(line("full export (store -> file)", n, w_exp, c_exp,
               f"{c_exp / c_plain:.2f}x plain's CPU; {summary.bytes / 1e6:.1f} MB"))  # fmt: skip
    print(line("our writer (rows -> file)", n, w_ours, c_ours,
               f"{c_ours / c_plain:.2f}x; typed table + redaction + checks + zstd; same bytes"))  # fmt: skip
    print(line("plain pyarrow (rows -> file)", n, w_plain, c_plain,
               "Table.from_pylist + write_table (zstd)"))  # fmt: skip
    print(f"  {fmt.value}: writing the rows takes {c_ours / c_plain:.2f}x the CPU of a plain pyarrow "
          f"write of them (goal: <= 3x); the whole export {c_exp / c_plain:.2f}x")  # fmt: skip
    return c_plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="Synthetic trajectories.")
    parser.add_argument("--keep", type=Path, default=None, help="Keep the store and outputs here.")
    parser.add_argument("--jobs", type=int, default=1, help="Also time a parallel run (N > 1).")
    parser.add_argument(
        "--all-formats", action="store_true", help="Full export in all six formats."
    )
    parser.add_argument("--repeat", type=int, default=3, help="Interleaved repetitions (best).")
    parser.add_argument(
        "--no-profile", action="store_true", help="Skip the cProfile run (about 2x the export)."
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        db = root / "runs.db"
        if not db.exists():
            _, t_pop, _ = timed(lambda: populate(db, args.n))
            print(f"store: {args.n} runs written in {t_pop:.1f} s", end=" ")
        else:
            print("store: reused", end=" ")
        print(f"({db.stat().st_size / 1e6:.0f} MB, {db})")
        store = open_store(db, readonly=True)
        redactor = Redactor.from_environment()
        plain_cpu: dict[ExportFormat, float] = {}
        for fmt in CHAT_FORMATS:
            plain_cpu[fmt] = compare(store, redactor, fmt, root, args.repeat)
        fmt = ExportFormat.RL
        out = root / "rl.parquet"

        def export() -> Any:
            return export_dataset(store, fmt, out, parquet=True, redactor=redactor)

        if args.jobs > 1:
            job_out = root / "rl-jobs.parquet"
            s, wall, _ = timed(
                lambda: export_dataset(
                    store, fmt, job_out, parquet=True, redactor=redactor, jobs=args.jobs
                )
            )
            assert job_out.read_bytes() == out.read_bytes()
            print(line(f"rl full export --jobs {args.jobs}", s.rows, wall, None, "same bytes"))

        for f in CHAT_FORMATS[:1]:
            print(f"\nwhere a one-process {f.value}/parquet export spends its CPU:")
            gc.disable()
            parts = phases(store, redactor, f)
            gc.enable()
            n = store_rows(store)
            total = sum(cpu for _, _, cpu in parts)
            for name, _wall, cpu in parts:
                print(f"  {name:22s} {cpu * 1e6 / n:7.0f} us/row  {cpu / total:4.0%}  "
                      f"({cpu / plain_cpu[f]:4.2f}x plain pyarrow's whole write)")  # fmt: skip
            print(f"  {'total':22s} {total * 1e6 / n:7.0f} us/row        "
                  f"({total / plain_cpu[f]:4.2f}x plain pyarrow's whole write)")  # fmt: skip

        if not args.no_profile:
            print("\ncProfile of one full rl export (own time, top functions):")
            for text in profile_top(export):
                print("  " + text)

        if args.all_formats:
            print(f"\nfull export, every format, {args.n} runs:")
            for f, parquet in [(f, p) for f in ExportFormat for p in (False, True)]:
                path = root / f"{f.value}.{'parquet' if parquet else 'jsonl'}"
                s, wall, cpu = timed(
                    lambda: export_dataset(store, f, path, parquet=parquet, redactor=redactor)  # noqa: B023
                )
                label = f"{f.value} {'parquet' if parquet else 'jsonl'}"
                print(line(label, s.rows, wall, cpu, f"{s.bytes / 1e6:.1f} MB"))


if __name__ == "__main__":
    main()
