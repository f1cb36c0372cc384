"""`export_dataset`: select runs from the store, build their trajectories, write one dataset file.

Runs are read in the store's creation order (created_at, then id), so the same store and
filters always produce the same bytes. Every row is validated against its format's schema
(pydantic model, then the fixed Arrow schema for Parquet) before it is written, and the file is
written atomically: on any error nothing appears at the output path.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from infra_agent.errors import UserError
from infra_agent.experiments.verdict import Verdict
from infra_agent.store.base import RunStore
from infra_agent.store.records import RunRecord
from infra_agent.trajectories.atif import Trajectory, VerdictCounts
from infra_agent.trajectories.build import RunBundle, build_trajectory, load_run
from infra_agent.trajectories.formats import (
    ARROW_SCHEMAS,
    ROW_MODELS,
    ExportFormat,
    atif_parquet_row,
    rl_row,
    sft_row,
)
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.writers import ParquetSink, arrow_table, atomic_file, jsonl_lines

BATCH_ROWS = 512
"""Rows validated and written per batch (one Parquet row group)."""


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


class _Selection:
    """Iterates the trajectories to export, counting what it passes over."""

    def __init__(self, store: RunStore, fmt: ExportFormat, flt: ExportFilter, redactor: Redactor, weights: RewardWeights) -> None:  # fmt: skip
        self.store, self.fmt, self.flt, self.redactor, self.weights = (
            store,
            fmt,
            flt,
            redactor,
            weights,
        )
        self.in_store = 0
        self.matched = 0
        self.skipped: Counter[str] = Counter()

    def __iter__(self) -> Iterator[Trajectory]:
        for run in self.store.iter_runs():
            self.in_store += 1
            if not self.flt.admits_run(run):
                continue
            bundle = load_run(self.store, run)
            try:
                trajectory = build_trajectory(bundle, redactor=self.redactor, weights=self.weights)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise UserError(
                    f"run {run.id}: cannot be exported: {where}: {first['msg']}"
                ) from exc
            if not self.flt.admits(bundle, trajectory):
                continue
            self.matched += 1
            if self.fmt is not ExportFormat.ATIF:
                if not bundle.steps:
                    self.skipped["no steps recorded"] += 1
                    continue
                if not any(s.role == "assistant" for s in bundle.steps):
                    self.skipped["no assistant message"] += 1
                    continue
            yield trajectory


def _rows(fmt: ExportFormat, parquet: bool, batch: list[Trajectory]) -> list[dict[str, Any]]:
    if fmt is ExportFormat.OPENAI_SFT:
        rows = [sft_row(t) for t in batch]
    elif fmt is ExportFormat.RL:
        rows = [rl_row(t) for t in batch]
    else:
        return [atif_parquet_row(t) for t in batch] if parquet else []
    TypeAdapter(list[ROW_MODELS[fmt]]).validate_python(rows)  # type: ignore[valid-type]
    return rows


def _batches(trajectories: Iterator[Trajectory], size: int) -> Iterator[list[Trajectory]]:
    batch: list[Trajectory] = []
    for t in trajectories:
        batch.append(t)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


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
) -> ExportSummary:
    """Write the selected runs to `out` as one JSONL or Parquet file, atomically.

    Raises UserError (nothing written) when no run matches, when `out` is a directory, or when a
    run cannot be represented in the schema.
    """
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file path")
    started = time.perf_counter()
    flt = flt or ExportFilter()
    selection = _Selection(
        store, fmt, flt, redactor or Redactor.from_environment(), weights or RewardWeights()
    )
    batches = _batches(iter(selection), batch_rows)
    first = next(batches, None)
    if first is None:
        skipped = "".join(f", {n} skipped ({why})" for why, n in sorted(selection.skipped.items()))
        raise UserError(
            f"nothing to export: {selection.matched} of {selection.in_store} runs in the store match the filters{skipped}"
        )
    rows = 0
    rewards: list[float] = []
    verdicts: Counter[str] = Counter()
    with atomic_file(out) as f:
        sink = ParquetSink(f, ARROW_SCHEMAS[fmt]) if parquet else None
        try:
            for batch in _chain(first, batches):
                table_rows = _rows(fmt, parquet, batch)
                if sink is not None:
                    sink.write(arrow_table(fmt, table_rows))
                elif fmt is ExportFormat.ATIF:
                    f.write("".join(t.model_dump_json() + "\n" for t in batch).encode())
                else:
                    f.write(jsonl_lines(table_rows))
                rows += len(batch)
                for t in batch:
                    rewards.append(t.final_metrics.extra.reward)
                    verdicts.update(v.value for v in t.verdicts())
        finally:
            if sink is not None:
                sink.close()  # also on error: the writer must let go of the temporary file
    return ExportSummary(
        format=fmt,
        parquet=parquet,
        path=str(out),
        rows=rows,
        runs_in_store=selection.in_store,
        runs_matched=selection.matched,
        skipped=dict(selection.skipped),
        bytes=out.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
        reward_mean=sum(rewards) / len(rewards) if rewards else None,
        verdict_counts=VerdictCounts(**verdicts),
    )


def _chain(first: list[Trajectory], rest: Iterator[list[Trajectory]]) -> Iterator[list[Trajectory]]:
    yield first
    yield from rest
