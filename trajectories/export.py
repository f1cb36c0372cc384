"""`export_dataset`: select runs from the store, turn them into rows, write one dataset file.

One path for every format: runs are read in the store's creation order (created_at, then id) in
batches; each run becomes its canonical `Trajectory` (`build`), the filters read it, and the
format makes its row (`formats`). A batch's rows become one table of the format's Arrow schema
(`arrow.to_table`: the types checked), every string in it is redacted (`Redactor.table`) and
the rest checked (`writers.check_table`); Parquet writes that table, JSONL its rows read back,
so both files hold the same columns and values. The file is written atomically: on any error
nothing appears at the output path.
The same store and filters always produce the same bytes, whatever the batches or processes.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, islice, repeat
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
from pydantic import BaseModel, Field, TypeAdapter

from infra_agent.errors import UserError
from infra_agent.redact import Redactor
from infra_agent.store import open_store
from infra_agent.store.base import RunStore
from infra_agent.store.records import RunRecord
from infra_agent.store.verdict import Verdict
from infra_agent.trajectories.arrow import json_text, table_rows, to_table
from infra_agent.trajectories.atif import Trajectory, VerdictCounts
from infra_agent.trajectories.build import ReviewIndex, build_trajectory, load_runs
from infra_agent.trajectories.formats import FORMATS, ExportFormat, OpenAIChatRow, strict_openai_row
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.writers import ParquetSink, atomic_file, check_table

BATCH_ROWS = 256
"""Runs per batch: read, built, redacted and validated together (one task of a worker process)."""


class ExportFilter(BaseModel):
    """Which runs to export. Empty lists mean 'any'."""

    tasks: list[str] = Field(default_factory=list)
    """Task names (exact)."""
    runs: list[str] = Field(default_factory=list)
    """Run ids (exact)."""
    since: datetime | None = None
    """Runs created at or after this instant (UTC)."""
    until: datetime | None = None
    """Runs created at or before this instant (UTC)."""
    verdicts: list[Verdict] = Field(default_factory=list)
    """Runs with at least one experiment of one of these verdicts."""
    min_reward: float | None = None
    """Runs whose trajectory reward (under the export's weights) is at least this."""
    reviewed_only: bool = False
    """Runs where a person decided on at least one proposal."""

    def admits_run(self, run: RunRecord) -> bool:
        """The checks that need only the run record (done before loading anything else)."""
        created = run.created_at if run.created_at.tzinfo else run.created_at.replace(tzinfo=UTC)
        return (
            (not self.tasks or run.task in self.tasks)
            and (not self.runs or run.id in self.runs)
            and (self.since is None or created >= self.since)
            and (self.until is None or created <= self.until)
        )

    def admits(self, t: Trajectory) -> bool:
        """The checks that need the run's trajectory (its reward under the export's weights)."""
        outcome = t.final_metrics.extra
        if self.reviewed_only and not outcome.reviewed:
            return False
        if self.verdicts and not set(self.verdicts) & set(t.verdicts()):
            return False
        return self.min_reward is None or outcome.reward >= self.min_reward


class ExportSummary(BaseModel):
    """What an export wrote."""

    format: ExportFormat
    parquet: bool
    path: str
    rows: int
    runs_in_store: int
    runs_matched: int
    skipped: dict[str, int]
    """Reason -> runs that matched the filters but could not form a row of this format."""
    bytes: int
    seconds: float
    reward_mean: float | None
    verdict_counts: VerdictCounts

    def render(self) -> str:
        kind = f"{self.format.value} ({'parquet' if self.parquet else 'jsonl'})"
        lines = [
            f"{self.rows} rows of {kind} -> {self.path} ({self.bytes / 1e6:.2f} MB, {self.seconds:.2f} s)",
            f"runs: {self.runs_in_store} in store, {self.runs_matched} matched the filters"
            + "".join(f", {n} skipped ({why})" for why, n in sorted(self.skipped.items())),
        ]
        if self.reward_mean is not None:
            lines.append(f"mean reward {self.reward_mean:.3f}")
        counts = ", ".join(f"{k} {v}" for k, v in self.verdict_counts.model_dump().items() if v)
        lines.append(f"verdicts: {counts or 'none'}")
        return "\n".join(lines)


@dataclass
class _Batch:
    """What one batch of runs became: the rows to write, and what the summary counts."""

    runs: int = 0
    """Runs read from the store."""
    payload: pa.Table | bytes | None = None
    """Redacted, validated rows: a table (Parquet) or JSON lines; None when no run gave a row."""
    rows: int = 0
    matched: int = 0
    """Runs that passed the filters (skipped ones included)."""
    skipped: Counter[str] = field(default_factory=Counter)
    rewards: list[float] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)


OPENAI_ROWS = TypeAdapter(list[OpenAIChatRow])


@dataclass
class _Producer:
    """Turns a batch of the store's runs into rows ready to write (picklable: runs in worker
    processes)."""

    fmt: ExportFormat
    parquet: bool
    flt: ExportFilter
    redactor: Redactor
    weights: RewardWeights
    strict_openai: bool = False

    def batch(self, store: RunStore, runs: list[RunRecord], review: ReviewIndex) -> _Batch:
        out, rows = _Batch(runs=len(runs)), []
        admitted = [run for run in runs if self.flt.admits_run(run)]
        form = FORMATS[self.fmt]
        for bundle in load_runs(store, admitted, review):
            t = build_trajectory(bundle, self.weights)
            if not self.flt.admits(t):
                continue
            out.matched += 1
            if form.needs_conversation and not bundle.steps:
                out.skipped["no steps recorded"] += 1
            elif form.needs_conversation and not any(s.role == "assistant" for s in bundle.steps):
                out.skipped["no assistant message"] += 1
            else:
                rows.append(form.row(t))
                out.rewards.append(t.final_metrics.extra.reward)
                out.verdicts += [v.value for v in t.verdicts()]
        if rows:
            out.rows = len(rows)
            out.payload = self._payload(rows)
        return out

    def _payload(self, rows: list[dict[str, Any]]) -> pa.Table | bytes:
        """The rows typed (the format's Arrow schema), redacted and checked: as a table, or as
        JSON lines read back from that table, so both files hold the same values."""
        form = FORMATS[self.fmt]
        table = self.redactor.table(to_table(rows, form.schema))
        check_table(self.fmt, table)
        if self.parquet:
            return table
        rows = table_rows(table)
        if self.strict_openai:
            rows = [strict_openai_row(r) for r in rows]
            OPENAI_ROWS.validate_python(rows)
        return "".join(json_text(r) + "\n" for r in rows).encode()


def _produce_batch(db: str, runs: list[RunRecord], producer: _Producer) -> _Batch:
    """Worker process: its own read-only connection to the store."""
    store = open_store(db, readonly=True)
    try:
        if db not in _WORKER_REVIEW:  # once per worker process
            _WORKER_REVIEW[db] = ReviewIndex(store)
        return producer.batch(store, runs, _WORKER_REVIEW[db])
    finally:
        store.close()


_WORKER_REVIEW: dict[str, ReviewIndex] = {}


def _chunks(runs: Iterator[RunRecord], size: int) -> Iterator[list[RunRecord]]:
    while chunk := list(islice(runs, size)):
        yield chunk


def _write_batch(f: IO[bytes], sink: ParquetSink | None, batch: _Batch) -> None:
    if sink is not None:
        sink.write(batch.payload)  # type: ignore[arg-type]
    else:
        f.write(batch.payload)  # type: ignore[arg-type]


def export_dataset(
    store: RunStore,
    fmt: ExportFormat,
    out: Path,
    *,
    parquet: bool = False,
    flt: ExportFilter | None = None,
    redactor: Redactor | None = None,
    weights: RewardWeights | None = None,
    batch_rows: int = BATCH_ROWS,
    jobs: int = 1,
    strict_openai: bool = False,
) -> ExportSummary:
    """Write the selected runs to `out` as one JSONL or Parquet file, atomically.

    With `jobs` > 1, batches are built in that many worker processes (each with its own
    read-only connection to a SQLite store) while this process writes them, in the same order
    as with one job. `strict_openai` (openai-sft JSONL only) writes only the keys OpenAI's
    fine-tuning API accepts (no `metadata`, no `reasoning_content`, no nulls). Raises UserError
    (nothing written) when no run matches, when `out` is a directory, or when a run cannot be
    represented in the schema.
    """
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file path")
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be at least 1")
    if strict_openai and (fmt is not ExportFormat.OPENAI_SFT or parquet):
        raise UserError("--strict-openai applies to --format openai-sft as JSONL only")
    started = time.perf_counter()
    producer = _Producer(
        fmt,
        parquet,
        flt or ExportFilter(),
        redactor or Redactor.from_environment(),
        weights or RewardWeights(),
        strict_openai,
    )
    chunks = _chunks(store.iter_runs(), batch_rows)
    db = getattr(store, "path", None)
    pool = None
    if jobs > 1 and isinstance(db, Path):
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        batches: Iterator[_Batch] = pool.map(
            _produce_batch, repeat(str(db)), chunks, repeat(producer)
        )
    else:
        review = ReviewIndex(store)
        batches = (producer.batch(store, chunk, review) for chunk in chunks)
    collecting = gc.isenabled()
    gc.disable()  # an export allocates millions of small acyclic objects: no cycles to collect
    try:
        return _write(out, fmt, parquet, batches, started)
    finally:
        if collecting:
            gc.enable()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _write(
    out: Path, fmt: ExportFormat, parquet: bool, batches: Iterator[_Batch], started: float
) -> ExportSummary:
    done = _Batch()  # the totals

    def count(batch: _Batch) -> _Batch:
        done.runs += batch.runs
        done.matched += batch.matched
        done.skipped.update(batch.skipped)
        return batch

    with_rows = (b for b in map(count, batches) if b.payload is not None)
    first = next(with_rows, None)
    if first is None:
        why = "".join(f", {n} skipped ({reason})" for reason, n in sorted(done.skipped.items()))
        raise UserError(
            f"nothing to export: {done.matched} of {done.runs} runs in the store match the filters{why}"
        )
    verdicts: Counter[str] = Counter()
    with atomic_file(out) as f:
        sink = ParquetSink(f, FORMATS[fmt].schema) if parquet else None
        try:
            for batch in chain([first], with_rows):
                _write_batch(f, sink, batch)
                done.rows += batch.rows
                done.rewards += batch.rewards
                verdicts.update(batch.verdicts)
            if sink is not None:
                sink.finish()
        finally:
            if sink is not None:
                sink.close()  # also on error: the writer must let go of the temporary file
    return ExportSummary(
        format=fmt,
        parquet=parquet,
        path=str(out),
        rows=done.rows,
        runs_in_store=done.runs,
        runs_matched=done.matched,
        skipped=dict(done.skipped),
        bytes=out.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
        reward_mean=sum(done.rewards) / len(done.rewards) if done.rewards else None,
        verdict_counts=VerdictCounts(**verdicts),
    )
