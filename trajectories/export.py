"""`export_dataset`: select runs from the store, build their trajectories, write one dataset file.

Runs are read in the store's creation order (created_at, then id), so the same store and
filters always produce the same bytes. Every row is validated against its format's schema
(pydantic model, then the fixed Arrow schema for Parquet) before it is written, and the file is
written atomically: on any error nothing appears at the output path.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain, repeat
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, Field, ValidationError

from infra_agent.errors import UserError
from infra_agent.experiments.verdict import Verdict
from infra_agent.store import open_store
from infra_agent.store.base import RunStore
from infra_agent.store.records import RunRecord
from infra_agent.trajectories.atif import Trajectory, VerdictCounts
from infra_agent.trajectories.build import ReviewIndex, RunBundle, build_trajectory, load_run
from infra_agent.trajectories.formats import (
    ARROW_SCHEMAS,
    ROW_MODELS,
    ExportFormat,
    OpenAIChatRow,
    atif_parquet_row,
    rl_row,
    sft_row,
    strict_openai_row,
)
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.writers import (
    ParquetSink,
    arrow_table,
    atomic_file,
    check_table,
    jsonl_lines,
)

BATCH_ROWS = 512
"""Rows written per batch (one Parquet row group)."""
CHUNK_RUNS = 32
"""Runs per task handed to a worker process (with jobs > 1)."""


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

    def admits(self, bundle: RunBundle, trajectory: Trajectory) -> bool:
        if self.reviewed_only and not bundle.reviewed:
            return False
        if self.verdicts and not set(self.verdicts) & {
            e.result.verdict for e in bundle.experiments
        }:
            return False
        return self.min_reward is None or trajectory.final_metrics.extra.reward >= self.min_reward


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
class _Item:
    """One run, converted and validated, ready to write."""

    payload: bytes | dict[str, Any]
    """A JSONL line, or a row for Parquet."""
    reward: float
    verdicts: list[str]


Outcome = _Item | str | None
"""What became of one run: an item, a skip reason, or None (filtered out)."""


@dataclass
class _Producer:
    """Turns one run of the store into an export item (picklable: runs in worker processes)."""

    fmt: ExportFormat
    parquet: bool
    flt: ExportFilter
    redactor: Redactor
    weights: RewardWeights
    strict_openai: bool = False

    def run(self, store: RunStore, run: RunRecord, review: ReviewIndex | None = None) -> Outcome:
        if not self.flt.admits_run(run):
            return None
        bundle = load_run(store, run, review)
        try:
            trajectory = build_trajectory(bundle, redactor=self.redactor, weights=self.weights)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UserError(f"run {run.id}: cannot be exported: {where}: {first['msg']}") from exc
        if not self.flt.admits(bundle, trajectory):
            return None
        if self.fmt is not ExportFormat.ATIF:
            if not bundle.steps:
                return "no steps recorded"
            if not any(s.role == "assistant" for s in bundle.steps):
                return "no assistant message"
        return _Item(
            payload=_payload(self.fmt, self.parquet, trajectory, self.strict_openai),
            reward=trajectory.final_metrics.extra.reward,
            verdicts=[v.value for v in trajectory.verdicts()],
        )


def _payload(
    fmt: ExportFormat, parquet: bool, t: Trajectory, strict_openai: bool = False
) -> bytes | dict[str, Any]:
    """The row of `t` in `fmt`. A JSONL row is validated here against the format's model; a
    Parquet row is validated with its batch, column-wise (`writers.check_table`)."""
    if fmt is ExportFormat.ATIF:
        return atif_parquet_row(t) if parquet else (t.model_dump_json() + "\n").encode()
    row = sft_row(t) if fmt is ExportFormat.OPENAI_SFT else rl_row(t)
    if parquet:
        return row
    if strict_openai:
        row = strict_openai_row(row)
        OpenAIChatRow.model_validate(row)
    else:
        ROW_MODELS[fmt].model_validate(row)
    return jsonl_lines([row])


def _produce_chunk(db: str, runs: list[RunRecord], producer: _Producer) -> list[Outcome]:
    """Worker process: its own read-only connection to the store."""
    store = open_store(db, readonly=True)
    try:
        if db not in _WORKER_REVIEW:  # once per worker process
            _WORKER_REVIEW[db] = ReviewIndex(store)
        return [producer.run(store, run, _WORKER_REVIEW[db]) for run in runs]
    finally:
        store.close()


_WORKER_REVIEW: dict[str, ReviewIndex] = {}


def _chunks(runs: Iterator[RunRecord], size: int) -> Iterator[list[RunRecord]]:
    chunk: list[RunRecord] = []
    for run in runs:
        chunk.append(run)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Counted:
    """Counts the runs read from the store as they pass."""

    def __init__(self, runs: Iterator[RunRecord]) -> None:
        self._runs, self.n = runs, 0

    def __iter__(self) -> Iterator[RunRecord]:
        for run in self._runs:
            self.n += 1
            yield run


def _write_batch(
    f: IO[bytes], sink: ParquetSink | None, fmt: ExportFormat, items: list[_Item]
) -> None:
    if sink is not None:
        table = arrow_table(fmt, [i.payload for i in items])  # type: ignore[misc]
        check_table(fmt, table)
        sink.write(table)
    else:
        f.write(b"".join(i.payload for i in items))  # type: ignore[misc]


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

    With `jobs` > 1, trajectories are built and validated in that many worker processes (each
    with its own read-only connection to a SQLite store), while this process writes, in the same
    order as with one job. `strict_openai` (openai-sft JSONL only) writes only the keys OpenAI's
    fine-tuning API accepts (no `metadata`, no `reasoning_content`). Raises UserError (nothing written) when no run matches, when `out` is
    a directory, or when a run cannot be represented in the schema.
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
    runs = _Counted(store.iter_runs())
    db = getattr(store, "path", None)
    pool = None
    if jobs > 1 and isinstance(db, Path):
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        outcomes: Iterator[Outcome] = chain.from_iterable(
            pool.map(
                _produce_chunk, repeat(str(db)), _chunks(iter(runs), CHUNK_RUNS), repeat(producer)
            )
        )
    else:
        review = ReviewIndex(store)
        outcomes = (producer.run(store, run, review) for run in runs)
    try:
        return _write(out, fmt, parquet, outcomes, runs, batch_rows, started)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _write(
    out: Path,
    fmt: ExportFormat,
    parquet: bool,
    outcomes: Iterator[Outcome],
    runs: _Counted,
    batch_rows: int,
    started: float,
) -> ExportSummary:
    matched, skipped = 0, Counter[str]()

    def items() -> Iterator[_Item]:
        nonlocal matched
        for outcome in outcomes:
            if outcome is None:
                continue
            matched += 1
            if isinstance(outcome, str):
                skipped[outcome] += 1
            else:
                yield outcome

    batches = _batches(items(), batch_rows)
    first = next(batches, None)
    if first is None:
        why = "".join(f", {n} skipped ({reason})" for reason, n in sorted(skipped.items()))
        raise UserError(
            f"nothing to export: {matched} of {runs.n} runs in the store match the filters{why}"
        )
    rows = 0
    rewards: list[float] = []
    verdicts: Counter[str] = Counter()
    with atomic_file(out) as f:
        sink = ParquetSink(f, ARROW_SCHEMAS[fmt]) if parquet else None
        try:
            for batch in _chain(first, batches):
                _write_batch(f, sink, fmt, batch)
                rows += len(batch)
                for item in batch:
                    rewards.append(item.reward)
                    verdicts.update(item.verdicts)
        finally:
            if sink is not None:
                sink.close()  # also on error: the writer must let go of the temporary file
    return ExportSummary(
        format=fmt,
        parquet=parquet,
        path=str(out),
        rows=rows,
        runs_in_store=runs.n,
        runs_matched=matched,
        skipped=dict(skipped),
        bytes=out.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
        reward_mean=sum(rewards) / len(rewards) if rewards else None,
        verdict_counts=VerdictCounts(**verdicts),
    )


def _batches(items: Iterator[_Item], size: int) -> Iterator[list[_Item]]:
    batch: list[_Item] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _chain(first: list[_Item], rest: Iterator[list[_Item]]) -> Iterator[list[_Item]]:
    yield first
    yield from rest
