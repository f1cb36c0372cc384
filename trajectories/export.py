"""`export_dataset`: select runs from the store, turn them into rows, write one dataset file.

Runs are read in the store's creation order (created_at, then id) and handled in batches, so the
same store and filters always produce the same bytes. `openai-sft` and `rl` rows are made from
the store records directly (`rows.run_row`, on the store's trusted JSON bodies when it offers
them: `trusted.load_trusted_runs`); as Parquet, a batch's table is built column-wise instead
(`chat_columns.ChatColumns`: the batch's steps as one Arrow array, read from the store's export
columns through ADBC where it keeps them (`store.columns`), else converted from the step bodies;
the conversation mapped with numpy and Arrow compute, Python only for runs not in the simple
shape; `run_columns.RunColumns`: rewards, metrics and proposals from arrays, the experiments,
proposals and decisions read as Arrow arrays from the same columns where the batch allows it,
`evidence.EvidenceColumns`), the same table either way. `atif` rows are the validated
`Trajectory` records.
Every batch is redacted (`Redactor.table` / `Redactor.texts`) and validated against its format's
schema (the fixed Arrow schema plus `writers.check_table`; pydantic for `Trajectory` and strict
OpenAI rows) before it is written, and the file is written atomically: on any error nothing
appears at the output path.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, repeat
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from infra_agent.errors import UserError
from infra_agent.experiments.verdict import Verdict
from infra_agent.store import open_store
from infra_agent.store.base import BodyFields, ExportColumns, RunStore, TrustedBodies
from infra_agent.store.records import RunRecord
from infra_agent.trajectories.atif import VerdictCounts
from infra_agent.trajectories.build import (
    ReviewIndex,
    RunBundle,
    load_runs,
    trajectory_tree,
    validate_trajectory,
)
from infra_agent.trajectories.chat_columns import SKIPS, ChatColumns
from infra_agent.trajectories.evidence import EvidenceColumns, ReviewColumns
from infra_agent.trajectories.formats import (
    ARROW_SCHEMAS,
    ExportFormat,
    OpenAIChatRow,
    atif_parquet_row,
    strict_openai_row,
)
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.rows import run_row
from infra_agent.trajectories.run_columns import RunColumns
from infra_agent.trajectories.trusted import TrustedReview, load_trusted_runs
from infra_agent.trajectories.writers import ParquetSink, arrow_table, atomic_file, check_table

BATCH_ROWS = 512
"""Runs per batch with jobs > 1 (one task for a worker process), and in the first batch of one
process. A batch's runs are built, redacted and validated together; the Parquet file's row
groups do not depend on the batches (`writers.ParquetSink`)."""
MAX_BATCH_ROWS = 2048
"""The most runs a batch of one process takes (`_Sizer`)."""
BATCH_BYTES = 32 << 20
"""About how much row data a batch of one process makes (`_Sizer`): big runs come in small
batches, so memory stays bounded; small runs in big ones, so per-batch costs (queries, Arrow
kernels, the redaction gate's compilation) spread over many rows."""


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
        if not (self.tasks or self.runs or self.since or self.until):
            return True
        created = run.created_at if run.created_at.tzinfo else run.created_at.replace(tzinfo=UTC)
        return (
            (not self.tasks or run.task in self.tasks)
            and (not self.runs or run.id in self.runs)
            and (self.since is None or created >= self.since)
            and (self.until is None or created <= self.until)
        )

    def admits(self, bundle: RunBundle, reward: float) -> bool:
        """The checks that need the run's records and its trajectory reward (`admits_values`
        of the bundle; each fact read only when a filter asks for it)."""
        reviewed = self.reviewed_only and bundle.reviewed
        verdicts = [e.result.verdict.value for e in bundle.experiments] if self.verdicts else []
        return self.admits_values(reviewed, verdicts, reward)

    def admits_values(self, reviewed: bool, verdicts: list[str], reward: float) -> bool:
        """`admits` of a run given as whether a person reviewed it, its experiments' verdict
        values and its reward."""
        if self.reviewed_only and not reviewed:
            return False
        if self.verdicts and not {v.value for v in self.verdicts} & set(verdicts):
            return False
        return self.min_reward is None or reward >= self.min_reward


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

    payload: pa.Table | bytes | None = None
    """Redacted, validated rows: a table (Parquet) or JSON lines; None when no run gave a row."""
    rows: int = 0
    matched: int = 0
    """Runs that passed the filters (skipped ones included)."""
    skipped: Counter[str] = field(default_factory=Counter)
    rewards: list[float] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)


@dataclass
class _Producer:
    """Turns a batch of the store's runs into rows ready to write (picklable: runs in worker
    processes). Per batch, not per run: redaction is one RE2 pass over all the batch's strings,
    and validation one pass of Arrow's typed conversion plus `check_table` over its columns."""

    fmt: ExportFormat
    parquet: bool
    flt: ExportFilter
    redactor: Redactor
    weights: RewardWeights
    strict_openai: bool = False
    trusted_bodies: bool = True

    def review(self) -> _Reviews:
        """The store's proposals and decisions, read once per export (per worker process), each
        form when a batch first needs it."""
        return _Reviews(self)

    def review_index(self, store: RunStore) -> ReviewIndex:
        """The proposals and decisions as the bundles read them: as the few fields the rows read
        (`trusted.TrustedReview`) where the rows come from the store's trusted bodies, else as
        validated records."""
        chat = self.fmt is not ExportFormat.ATIF
        trusted = isinstance(store, TrustedBodies) and isinstance(store, BodyFields)
        if chat and self.trusted_bodies and trusted:
            return TrustedReview(cast(BodyFields, store))
        return ReviewIndex(store)

    def batch(self, store: RunStore, runs: list[RunRecord], review: _Reviews) -> _Batch:
        admitted = [run for run in runs if self.flt.admits_run(run)]
        if not admitted:
            return _Batch()
        if self.fmt is ExportFormat.ATIF:
            return self._trajectories(load_runs(store, admitted, review.index(store)))
        if self.parquet and self.trusted_bodies and isinstance(store, ExportColumns):
            made = self._from_columns(store, admitted, review)
            if made is not None:
                return made
        rows = load_row_runs(store, admitted, review.index(store), trusted=self.trusted_bodies)
        return self._rows(rows)

    def _from_columns(
        self, store: RunStore, runs: list[RunRecord], review: _Reviews
    ) -> _Batch | None:
        """The batch from the store's export columns (steps, experiments, proposals and
        decisions as Arrow arrays); None when the store does not keep them."""
        columns, ids = cast(ExportColumns, store), [run.id for run in runs]
        steps = columns.step_columns_of_runs(ids)
        if steps is None:
            return None
        chat = ChatColumns(runs, steps)
        experiments, reviews = columns.experiment_table_of_runs(ids), review.columns(columns)
        evidence = None
        if experiments is not None and reviews is not None:
            evidence = EvidenceColumns.of_store(runs, experiments, reviews)
        if evidence is None:  # not the common shape (`evidence`): from the bundles
            bundles = load_trusted_runs(store, runs, review.index(store), steps=False)
            evidence = EvidenceColumns.of_bundles(bundles)
        return self._columns(chat, RunColumns(runs, evidence, chat, self.weights.model_dump()))

    def _rows(self, bundles: list[RunBundle]) -> _Batch:
        if self.parquet and bundles and all(b.step_bodies is not None for b in bundles):
            try:
                chat = ChatColumns.of_bundles(bundles)
            except OverflowError:
                pass  # over 2 GiB of text in one batch: row by row
            else:
                weights = self.weights.model_dump()
                return self._columns(chat, RunColumns.of_bundles(bundles, chat, weights))
        out, rows = _Batch(), []
        weights = self.weights.model_dump()
        for bundle in bundles:
            made = run_row(bundle, self.fmt, weights)
            if not self.flt.admits(bundle, made.reward):
                continue
            out.matched += 1
            if made.skip is not None:
                out.skipped[made.skip] += 1
            else:
                rows.append(made.row)
                out.rewards.append(made.reward)
                out.verdicts += made.verdicts
        if not rows:
            return out
        out.rows = len(rows)
        if self.parquet:
            table = arrow_table(self.fmt, rows, self.redactor)
            check_table(self.fmt, table)
            out.payload = table
            return out
        if self.strict_openai:
            rows = [strict_openai_row(r) for r in rows]
            OPENAI_ROWS.validate_python(rows)
        else:
            check_table(self.fmt, arrow_table(self.fmt, rows))
        out.payload = self._lines(rows)
        return out

    def _columns(self, chat: ChatColumns, columns: RunColumns) -> _Batch:
        """`_rows` as Parquet, built column-wise (`chat_columns`, `run_columns`): same table."""
        out, flt, reward = _Batch(), self.flt, columns.reward
        admitted = np.arange(len(chat.runs))
        if flt.verdicts or flt.reviewed_only or flt.min_reward is not None:
            reviewed = columns.reviewed.tolist()
            admitted = admitted[[flt.admits_values(reviewed[i], columns.verdicts[i], reward[i])
                                 for i in admitted.tolist()]]  # fmt: skip
        codes = chat.skip_codes[admitted]
        out.matched = len(admitted)
        out.skipped.update(
            {cast(str, SKIPS[c]): n for c, n in Counter(codes.tolist()).items() if c}
        )
        kept = admitted[codes == 0].tolist()
        if not kept:
            return out
        out.rewards = [reward[i] for i in kept]
        out.verdicts = list(chain.from_iterable(columns.verdicts[i] for i in kept))
        out.rows = len(kept)
        table = columns.table(self.fmt, kept, self.redactor)
        check_table(self.fmt, table)
        out.payload = table
        return out

    def _lines(self, rows: list[dict[str, Any]]) -> bytes:
        """Rows as redacted JSON lines. Redaction never removes a quote, so a redacted line is
        still the same JSON document; each changed line is parsed to be sure (if a redaction broke
        an escape, that row's strings are redacted one by one instead)."""
        lines = [json.dumps(r, ensure_ascii=False) for r in rows]
        redacted = self.redactor.texts(lines)
        if redacted is not lines:
            for i, (new, old) in enumerate(zip(redacted, lines, strict=True)):
                if new is not old:
                    try:
                        json.loads(new)
                    except ValueError:
                        redacted[i] = json.dumps(self.redactor.tree(rows[i]), ensure_ascii=False)
        return ("\n".join(redacted) + "\n").encode()

    def _trajectories(self, bundles: list[RunBundle]) -> _Batch:
        out, kept = _Batch(), []
        trees = [trajectory_tree(b, self.weights) for b in bundles]
        texts = self.redactor.texts([json.dumps(t, ensure_ascii=False) for t in trees])
        for bundle, tree, text in zip(bundles, trees, texts, strict=True):
            try:
                trajectory = validate_trajectory(text, tree, self.redactor)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise UserError(
                    f"run {bundle.run.id}: cannot be exported: {where}: {first['msg']}"
                ) from exc
            if not self.flt.admits(bundle, trajectory.final_metrics.extra.reward):
                continue
            out.matched += 1
            kept.append(trajectory)
            out.rewards.append(trajectory.final_metrics.extra.reward)
            out.verdicts += [v.value for v in trajectory.verdicts()]
        if not kept:
            return out
        out.rows = len(kept)
        if self.parquet:
            table = arrow_table(self.fmt, [atif_parquet_row(t) for t in kept])
            check_table(self.fmt, table)
            out.payload = table
        else:
            out.payload = "".join(t.model_dump_json() + "\n" for t in kept).encode()
        return out


class _Reviews:
    """An export's view of the store's proposals and decisions, read once (per worker process)
    in the form a batch first asks for: arrays for the column path (`evidence.ReviewColumns`),
    an index for the bundles (`_Producer.review_index`)."""

    def __init__(self, producer: _Producer) -> None:
        self._producer = producer
        self._index: ReviewIndex | None = None
        self._columns: ReviewColumns | None = None
        self._read_columns = False

    def index(self, store: RunStore) -> ReviewIndex:
        if self._index is None:
            self._index = self._producer.review_index(store)
        return self._index

    def columns(self, store: ExportColumns) -> ReviewColumns | None:
        """None when the store does not keep the review's export columns."""
        if not self._read_columns:
            tables = store.review_tables()
            self._columns = ReviewColumns(*tables) if tables is not None else None
            self._read_columns = True
        return self._columns


OPENAI_ROWS = TypeAdapter(list[OpenAIChatRow])


def load_row_runs(
    store: RunStore, runs: list[RunRecord], review: ReviewIndex, *, trusted: bool = True
) -> list[RunBundle]:
    """The bundles `rows.run_row` makes the chat and RL rows of: from the store's trusted bodies
    when it offers them and `trusted` (`trusted.load_trusted_runs`), else its validated records
    (same rows either way)."""
    if trusted and isinstance(store, TrustedBodies):
        return load_trusted_runs(store, runs, review)
    return load_runs(store, runs, review, patches=False)


def _produce_batch(db: str, runs: list[RunRecord], producer: _Producer) -> _Batch:
    """Worker process: its own read-only connection to the store."""
    store = open_store(db, readonly=True)
    try:
        if db not in _WORKER_REVIEW:  # once per worker process
            _WORKER_REVIEW[db] = producer.review()
        return producer.batch(store, runs, _WORKER_REVIEW[db])
    finally:
        store.close()


_WORKER_REVIEW: dict[str, _Reviews] = {}


def _chunks(runs: Iterator[RunRecord], size: Callable[[], int]) -> Iterator[list[RunRecord]]:
    """The runs in batches of `size()` runs (asked again before each batch)."""
    chunk: list[RunRecord] = []
    wanted = size()
    for run in runs:
        chunk.append(run)
        if len(chunk) >= wanted:
            yield chunk
            chunk = []
            wanted = size()
    if chunk:
        yield chunk


class _Sizer:
    """How many runs the next batch of one process takes: `BATCH_ROWS` first, then as many as
    make about `BATCH_BYTES` of rows at the size per run the last batch that made rows had,
    between 1 and `MAX_BATCH_ROWS`; always `fixed` when given."""

    def __init__(self, fixed: int | None) -> None:
        self._fixed = fixed
        self._next = fixed or BATCH_ROWS

    def __call__(self) -> int:
        return self._next

    def saw(self, batch: _Batch, runs: int) -> _Batch:
        """Learn from a batch of `runs` runs; returns it."""
        if self._fixed is None and batch.payload is not None:
            payload = batch.payload
            size = payload.nbytes if isinstance(payload, pa.Table) else len(payload)
            per_run = max(size / runs, 1.0)
            self._next = max(1, min(MAX_BATCH_ROWS, int(BATCH_BYTES / per_run)))
        return batch


class _Counted:
    """Counts the runs read from the store as they pass."""

    def __init__(self, runs: Iterator[RunRecord]) -> None:
        self._runs, self.n = runs, 0

    def __iter__(self) -> Iterator[RunRecord]:
        for run in self._runs:
            self.n += 1
            yield run


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
    batch_rows: int | None = None,
    jobs: int = 1,
    strict_openai: bool = False,
    trusted_bodies: bool = True,
) -> ExportSummary:
    """Write the selected runs to `out` as one JSONL or Parquet file, atomically.

    With `jobs` > 1, trajectories are built and validated in that many worker processes (each
    with its own read-only connection to a SQLite store), while this process writes, in the same
    order as with one job. `batch_rows`: runs per batch (default: `BATCH_ROWS` with jobs > 1;
    sized by the rows' bytes in one process, `_Sizer`); the file's bytes are the same whatever
    the batches. `strict_openai` (openai-sft JSONL only) writes only the keys OpenAI's
    fine-tuning API accepts (no `metadata`, no `reasoning_content`). `trusted_bodies=False`
    builds the chat and RL rows from validated records instead of the store's trusted bodies
    (the reference path: same bytes, slower). Raises UserError (nothing written) when no run matches, when `out` is
    a directory, or when a run cannot be represented in the schema.
    """
    if out.is_dir():
        raise UserError(f"--out {out}: is a directory; give a file path")
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be at least 1")
    if strict_openai and (fmt is not ExportFormat.OPENAI_SFT or parquet):
        raise UserError("--strict-openai applies to --format openai-sft as JSONL only")
    started = time.perf_counter()
    collecting = gc.isenabled()
    gc.disable()  # an export allocates millions of small acyclic objects: no cycles to collect
    try:
        return _export(store, fmt, out, parquet, flt, redactor, weights, batch_rows, jobs,
                       strict_openai, trusted_bodies, started)  # fmt: skip
    finally:
        if collecting:
            gc.enable()


def _export(
    store: RunStore,
    fmt: ExportFormat,
    out: Path,
    parquet: bool,
    flt: ExportFilter | None,
    redactor: Redactor | None,
    weights: RewardWeights | None,
    batch_rows: int | None,
    jobs: int,
    strict_openai: bool,
    trusted_bodies: bool,
    started: float,
) -> ExportSummary:
    producer = _Producer(
        fmt,
        parquet,
        flt or ExportFilter(),
        redactor or Redactor.from_environment(),
        weights or RewardWeights(),
        strict_openai,
        trusted_bodies,
    )
    runs = _Counted(store.iter_runs())
    db = getattr(store, "path", None)
    pool = None
    if jobs > 1 and isinstance(db, Path):
        pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        chunks = _chunks(iter(runs), lambda: batch_rows or BATCH_ROWS)
        batches: Iterator[_Batch] = pool.map(
            _produce_batch, repeat(str(db)), chunks, repeat(producer)
        )
    else:
        review, sizer = producer.review(), _Sizer(batch_rows)
        batches = (
            sizer.saw(producer.batch(store, chunk, review), len(chunk))
            for chunk in _chunks(iter(runs), sizer)
        )
    try:
        return _write(out, fmt, parquet, batches, runs, started)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _write(
    out: Path,
    fmt: ExportFormat,
    parquet: bool,
    batches: Iterator[_Batch],
    runs: _Counted,
    started: float,
) -> ExportSummary:
    done = _Batch()  # the totals

    def count(batch: _Batch) -> _Batch:
        done.matched += batch.matched
        done.skipped.update(batch.skipped)
        return batch

    with_rows = (b for b in map(count, batches) if b.payload is not None)
    first = next(with_rows, None)
    if first is None:
        why = "".join(f", {n} skipped ({reason})" for reason, n in sorted(done.skipped.items()))
        raise UserError(
            f"nothing to export: {done.matched} of {runs.n} runs in the store match the filters{why}"
        )
    verdicts: Counter[str] = Counter()
    with atomic_file(out) as f:
        sink = ParquetSink(f, ARROW_SCHEMAS[fmt]) if parquet else None
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
        runs_in_store=runs.n,
        runs_matched=done.matched,
        skipped=dict(done.skipped),
        bytes=out.stat().st_size,
        seconds=round(time.perf_counter() - started, 3),
        reward_mean=sum(done.rewards) / len(done.rewards) if done.rewards else None,
        verdict_counts=VerdictCounts(**verdicts),
    )
