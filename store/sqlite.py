"""SQLite implementation of the run store: one file, WAL mode, transactional writes.

Each record is stored whole as JSON in `body`, with the columns needed for lookups beside it.
The schema version lives in `meta`; a database written by a newer infra-agent is refused.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from infra_agent.errors import StoreError
from infra_agent.private import private_sqlite
from infra_agent.store import columns
from infra_agent.store.columns import COLUMNS_SCHEMA_VERSION, ColumnReader, StepColumns
from infra_agent.store.records import (
    STORE_SCHEMA_VERSION,
    DecisionRecord,
    ExperimentRecord,
    FeedbackRecord,
    PatchRecord,
    ProposalRecord,
    ProposalStatus,
    RunRecord,
    StepRecord,
    now,
)

if TYPE_CHECKING:  # pyarrow is only needed by exports
    import pyarrow as pa

R = TypeVar("R", bound=BaseModel)


@cache
def _list_adapter(model: type[R]) -> TypeAdapter[list[R]]:
    return TypeAdapter(list[model])  # type: ignore[valid-type]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (id TEXT PRIMARY KEY, created_at TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS patches (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiments (
    id TEXT PRIMARY KEY, run_id TEXT, started_at TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS experiments_run ON experiments (run_id);
CREATE TABLE IF NOT EXISTS feedback (
    id TEXT PRIMARY KEY, run_id TEXT, created_at TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS proposals (
    id TEXT PRIMARY KEY, run_id TEXT, status TEXT NOT NULL, created_at TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS decisions (
    id TEXT PRIMARY KEY, proposal_id TEXT NOT NULL, created_at TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS feedback_run ON feedback (run_id);
CREATE INDEX IF NOT EXISTS proposals_run ON proposals (run_id);
CREATE INDEX IF NOT EXISTS decisions_proposal ON decisions (proposal_id);
CREATE TRIGGER IF NOT EXISTS decisions_append_only_u BEFORE UPDATE ON decisions
    BEGIN SELECT RAISE(ABORT, 'decisions are append-only'); END;
CREATE TRIGGER IF NOT EXISTS decisions_append_only_d BEFORE DELETE ON decisions
    BEGIN SELECT RAISE(ABORT, 'decisions are append-only'); END;
"""


class SQLiteRunStore:
    """Run store in one SQLite file. Safe for one writer and concurrent readers (WAL)."""

    def __init__(self, path: Path | str, *, readonly: bool = False) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._lock = threading.RLock()
        if not readonly:
            private_sqlite(self.path)  # 0600 before SQLite creates it (and its -wal/-shm)
        elif not self.path.exists():
            raise StoreError(f"run store {self.path}: not found")
        try:
            conn = self._conn()
            self._check_and_migrate(conn, readonly)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"run store {self.path}: not a readable SQLite database ({exc})"
            ) from exc

    # -- connection handling -------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
            self._local.depth = 0
        return conn

    def _check_and_migrate(self, conn: sqlite3.Connection, readonly: bool) -> None:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        version = 0
        if "meta" in tables:
            row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > STORE_SCHEMA_VERSION:
                raise StoreError(
                    f"run store {self.path}: schema version {version} is newer than this "
                    f"infra-agent supports ({STORE_SCHEMA_VERSION}); upgrade infra-agent"
                )
        elif tables and not readonly:
            raise StoreError(f"run store {self.path}: not an infra-agent database (no meta table)")
        elif readonly:
            # An empty file (a writer is creating it right now) or another program's database.
            raise StoreError(f"run store {self.path}: not an initialised infra-agent database")
        if readonly:
            self.has_columns = version >= COLUMNS_SCHEMA_VERSION
            return
        with self.transaction():
            for statement in _SCHEMA.split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', '1')")
            version = int(
                conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
            )
            if version < COLUMNS_SCHEMA_VERSION:  # an older file: add the export columns
                for statement in columns.migration():
                    conn.execute(statement)
            conn.execute(
                "UPDATE meta SET value=? WHERE key='schema_version'", (str(STORE_SCHEMA_VERSION),)
            )
        self.has_columns = True

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._lock:
            conn = self._conn()
            outer = self._local.depth == 0
            if outer:
                conn.execute("BEGIN IMMEDIATE")
            self._local.depth += 1
            try:
                yield
            except BaseException:
                self._local.depth -= 1
                if outer:
                    conn.execute("ROLLBACK")
                raise
            else:
                self._local.depth -= 1
                if outer:
                    conn.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        reader = getattr(self._local, "columns", None)
        if reader is not None:
            reader.close()
            self._local.columns = None

    # -- helpers ----------------------------------------------------------------------------
    def _load(self, model: type[R], body: str) -> R:
        try:
            return model.model_validate_json(body)
        except ValidationError as exc:
            raise StoreError(f"run store {self.path}: a {model.__name__} row is malformed") from exc

    def _one(self, model: type[R], sql: str, args: tuple[object, ...]) -> R | None:
        row = self._conn().execute(sql, args).fetchone()
        return self._load(model, row[0]) if row else None

    def _many(self, model: type[R], sql: str, args: tuple[object, ...] = ()) -> list[R]:
        return [self._load(model, r[0]) for r in self._conn().execute(sql, args).fetchall()]

    @staticmethod
    def _body(record: BaseModel) -> str:
        """The JSON stored for a record, with secrets (API keys, tokens, secret env values)
        replaced by [REDACTED]: nothing secret is written in the first place. Patches are stored
        as they are (their id is the hash of their content) and so are not passed through here."""
        from infra_agent.trajectories.redact import redact_text

        return redact_text(record.model_dump_json())

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        with self.transaction():
            self._conn().execute(sql, args)

    # -- runs -------------------------------------------------------------------------------
    def put_run(self, run: RunRecord) -> None:
        run.updated_at = now()
        self._write(
            "INSERT OR REPLACE INTO runs (id, created_at, body) VALUES (?, ?, ?)",
            (run.id, run.created_at.isoformat(), self._body(run)),
        )

    def get_run(self, run_id: str) -> RunRecord | None:
        return self._one(RunRecord, "SELECT body FROM runs WHERE id=?", (run_id,))

    def list_runs(self, limit: int = 100) -> list[RunRecord]:
        return self._many(
            RunRecord, "SELECT body FROM runs ORDER BY created_at DESC LIMIT ?", (limit,)
        )

    def iter_runs(self) -> Iterator[RunRecord]:
        """Every run, oldest first (created_at, then id); validated a chunk at a time (one
        pydantic call per chunk's JSON array: a third cheaper than one call per run)."""
        adapter = _list_adapter(RunRecord)
        cursor = self._conn().execute("SELECT body FROM runs ORDER BY created_at, id")
        while rows := cursor.fetchmany(self._IN_CHUNK):
            try:
                yield from adapter.validate_json("[" + ",".join(r[0] for r in rows) + "]")
            except ValidationError as exc:
                raise StoreError(f"run store {self.path}: a RunRecord row is malformed") from exc

    # -- steps ------------------------------------------------------------------------------
    def add_step(self, step: StepRecord) -> StepRecord:
        with self.transaction():
            conn = self._conn()
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), -1) FROM steps WHERE run_id=?", (step.run_id,)
            ).fetchone()
            stored = step.model_copy(update={"seq": int(row[0]) + 1})
            body = self._body(stored)
            fields = orjson.loads(body)  # the columns hold the body's (redacted) values
            conn.execute(
                columns.STEP_INSERT,
                (stored.run_id, stored.seq, body, *columns.step_values(fields)),
            )
            conn.executemany(columns.CALL_INSERT, columns.call_rows(fields))
        return stored

    def steps(self, run_id: str) -> list[StepRecord]:
        return self._many(
            StepRecord, "SELECT body FROM steps WHERE run_id=? ORDER BY seq", (run_id,)
        )

    # -- bulk reads (exports) ------------------------------------------------------------------
    def steps_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[StepRecord]]:
        """Steps of many runs (each in seq order), a few queries for all: run id -> steps."""
        return self._grouped(
            StepRecord, "SELECT run_id, body FROM steps WHERE run_id IN ({}) ORDER BY run_id, seq",
            run_ids,
        )  # fmt: skip

    def experiments_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[ExperimentRecord]]:
        """Experiments of many runs (each run's in `experiments(run_id)` order): run id -> them."""
        return self._grouped(
            ExperimentRecord,
            "SELECT run_id, body FROM experiments WHERE run_id IN ({}) ORDER BY run_id, started_at, id",
            run_ids,
        )

    def patches_by_id(self, patch_ids: Sequence[str]) -> dict[str, PatchRecord]:
        """The stored patches among `patch_ids`: id -> patch."""
        found = self._grouped(
            PatchRecord, "SELECT id, body FROM patches WHERE id IN ({})", patch_ids
        )
        return {patch_id: patches[0] for patch_id, patches in found.items()}

    def step_bodies_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """`steps_of_runs` as the stored JSON bodies, parsed but not validated (each in the shape
        of `StepRecord.model_dump(mode="json")`): run id -> bodies in seq order. For exports of
        many runs: every body was validated when it was written, and parsing is a few times
        cheaper than building the records."""
        return self._grouped_bodies(
            "SELECT run_id, body FROM steps WHERE run_id IN ({}) ORDER BY run_id, seq", run_ids
        )

    def experiment_bodies_of_runs(self, run_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        """`experiments_of_runs` as parsed, unvalidated JSON bodies (`ExperimentRecord`'s shape)."""
        return self._grouped_bodies(
            "SELECT run_id, body FROM experiments WHERE run_id IN ({}) ORDER BY run_id, started_at, id",
            run_ids,
        )  # fmt: skip

    def experiment_fields_of_runs(
        self, run_ids: Sequence[str], paths: Sequence[str]
    ) -> dict[str, list[list[Any]]]:
        """The values at JSON `paths` (at least two, e.g. `$.result.verdict`) of each experiment
        body of many runs, in `experiments_of_runs` order: run id -> one list of values per
        experiment (None where a path is absent). SQLite picks them out of each body (one parse,
        numbers and strings copied as written) and one orjson call parses a query's picks: far
        cheaper than parsing whole bodies with their sample arrays."""
        if len(paths) < 2:
            raise ValueError("experiment_fields_of_runs: give at least two paths")
        marks = ",".join("?" * len(paths))
        sql = (
            f"SELECT run_id, json_extract(body, {marks}) FROM experiments WHERE run_id IN ({{}})"
            " ORDER BY run_id, started_at, id"
        )
        out: dict[str, list[list[Any]]] = {}
        try:
            for rows in self._chunked_rows(sql, run_ids, paths):
                picks = self._json_array([r[1] for r in rows])
                for (key, _), picked in zip(rows, picks, strict=True):
                    out.setdefault(key, []).append(picked)
        except sqlite3.OperationalError as exc:  # json_extract on a body that is not JSON
            raise StoreError(f"run store {self.path}: a stored body is not JSON") from exc
        return out

    def step_columns_of_runs(self, run_ids: Sequence[str]) -> StepColumns | None:
        """The steps of `run_ids` (distinct) as Arrow columns (`columns.StepColumns`), runs in
        that order; None when this file predates the export columns (a read-only opener of an
        older store) or ADBC's SQLite driver is not installed."""
        reader = self._column_reader()
        return reader.steps(run_ids) if reader is not None else None

    def experiment_columns_of_runs(
        self, run_ids: Sequence[str]
    ) -> dict[str, list[list[Any]]] | None:
        """`experiment_fields_of_runs(run_ids, columns.EXPERIMENT_FIELDS)` from the experiments'
        export columns (no JSON to parse), for distinct `run_ids`; None as for
        `step_columns_of_runs`."""
        reader = self._column_reader()
        return reader.experiments(run_ids) if reader is not None else None

    def experiment_table_of_runs(self, run_ids: Sequence[str]) -> pa.Table | None:
        """The experiments of `run_ids` (distinct) as one Arrow table of their export columns
        (`columns.ColumnReader.experiment_table`); None as for `step_columns_of_runs`."""
        reader = self._column_reader()
        return reader.experiment_table(run_ids) if reader is not None else None

    def review_tables(self) -> tuple[pa.Table, pa.Table] | None:
        """Every proposal and decision as Arrow tables of their export columns
        (`columns.ColumnReader.review_tables`); None as for `step_columns_of_runs`."""
        reader = self._column_reader()
        return reader.review_tables() if reader is not None else None

    def _column_reader(self) -> ColumnReader | None:
        if not self.has_columns or not ColumnReader.available():
            return None
        reader = getattr(self._local, "columns", None)
        if reader is None:
            reader = self._local.columns = ColumnReader(self.path)
        return cast(ColumnReader, reader)

    def review_columns(self) -> tuple[list[list[Any]], list[list[Any]]] | None:
        """`review_fields(columns.PROPOSAL_FIELDS, columns.DECISION_FIELDS)` from the
        proposals' and decisions' export columns; None as for `step_columns_of_runs`."""
        reader = self._column_reader()
        return reader.review() if reader is not None else None

    def review_fields(
        self, proposal_paths: Sequence[str], decision_paths: Sequence[str]
    ) -> tuple[list[list[Any]], list[list[Any]]]:
        """The values at JSON paths (at least two each) of every proposal body, in `proposals()`
        order, and of every decision body, in `decisions()` order (None where a path is absent),
        picked as in `experiment_fields_of_runs`."""
        return (
            self._picked("proposals", proposal_paths, "created_at, id"),
            self._picked("decisions", decision_paths, "created_at, id"),
        )

    def _picked(self, table: str, paths: Sequence[str], order: str) -> list[list[Any]]:
        if len(paths) < 2:
            raise ValueError(f"{table}: give at least two JSON paths")
        marks = ",".join("?" * len(paths))
        sql = f"SELECT json_extract(body, {marks}) FROM {table} ORDER BY {order}"
        try:
            rows = self._conn().execute(sql, list(paths)).fetchall()
        except sqlite3.OperationalError as exc:
            raise StoreError(f"run store {self.path}: a stored body is not JSON") from exc
        return self._json_array([r[0] for r in rows])

    def _json_array(self, texts: list[str]) -> list[Any]:
        """The JSON values `texts` (one per row, as SQLite wrote them), parsed in one call."""
        try:
            parsed: list[Any] = orjson.loads("[" + ",".join(texts) + "]")
        except (orjson.JSONDecodeError, TypeError) as exc:
            raise StoreError(f"run store {self.path}: a stored body is not JSON") from exc
        return parsed

    def _chunked_rows(
        self, sql: str, keys: Sequence[str], params: Sequence[object] = ()
    ) -> Iterator[list[Any]]:
        """The rows of `sql` (its `IN ({})` filled with one chunk of the distinct `keys`, after
        `params`), one chunk's rows at a time."""
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), self._IN_CHUNK):
            chunk = unique[start : start + self._IN_CHUNK]
            query = sql.format(",".join("?" * len(chunk)))
            yield self._conn().execute(query, [*params, *chunk]).fetchall()

    def _grouped_bodies(self, sql: str, keys: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        loads = orjson.loads
        for rows in self._chunked_rows(sql, keys):
            try:
                for key, body in rows:
                    out.setdefault(key, []).append(loads(body))
            except orjson.JSONDecodeError as exc:
                raise StoreError(f"run store {self.path}: a stored body is not JSON") from exc
        return out

    _IN_CHUNK = 500
    """Ids per `IN (...)` query (SQLite allows 999 parameters in old builds)."""

    def _grouped(self, model: type[R], sql: str, keys: Sequence[str]) -> dict[str, list[R]]:
        """Rows of (key, body) as key -> records. Each query's bodies are parsed by one pydantic
        call on their JSON array, not one call per row."""
        adapter = _list_adapter(model)
        out: dict[str, list[R]] = {}
        for rows in self._chunked_rows(sql, keys):
            try:
                records = adapter.validate_json("[" + ",".join(r[1] for r in rows) + "]")
            except ValidationError as exc:
                raise StoreError(
                    f"run store {self.path}: a {model.__name__} row is malformed"
                ) from exc
            for (key, _), record in zip(rows, records, strict=True):
                out.setdefault(key, []).append(record)
        return out

    # -- patches, experiments, feedback -------------------------------------------------------
    def put_patch(self, patch: PatchRecord) -> None:
        self._write(
            "INSERT OR IGNORE INTO patches (id, body) VALUES (?, ?)",
            (patch.id, patch.model_dump_json()),
        )

    def get_patch(self, patch_id: str) -> PatchRecord | None:
        return self._one(PatchRecord, "SELECT body FROM patches WHERE id=?", (patch_id,))

    def put_experiment(self, experiment: ExperimentRecord) -> None:
        body = self._body(experiment)
        self._write(
            columns.EXPERIMENT_INSERT,
            (
                experiment.id,
                experiment.run_id,
                experiment.started_at.isoformat(),
                body,
                *columns.experiment_values(orjson.loads(body)),
            ),
        )

    def get_experiment(self, experiment_id: str) -> ExperimentRecord | None:
        return self._one(
            ExperimentRecord, "SELECT body FROM experiments WHERE id=?", (experiment_id,)
        )

    def experiments(self, run_id: str | None = None) -> list[ExperimentRecord]:
        if run_id is None:
            return self._many(
                ExperimentRecord, "SELECT body FROM experiments ORDER BY started_at, id"
            )
        return self._many(
            ExperimentRecord,
            "SELECT body FROM experiments WHERE run_id=? ORDER BY started_at, id",
            (run_id,),
        )

    def put_feedback(self, record: FeedbackRecord) -> None:
        self._write(
            "INSERT OR REPLACE INTO feedback (id, run_id, created_at, body) VALUES (?, ?, ?, ?)",
            (record.id, record.run_id, record.created_at.isoformat(), self._body(record)),
        )

    def feedback(self, run_id: str | None = None) -> list[FeedbackRecord]:
        if run_id is None:
            return self._many(FeedbackRecord, "SELECT body FROM feedback ORDER BY created_at, id")
        return self._many(
            FeedbackRecord,
            "SELECT body FROM feedback WHERE run_id=? ORDER BY created_at, id",
            (run_id,),
        )

    # -- review queue -------------------------------------------------------------------------
    def put_proposal(self, proposal: ProposalRecord) -> None:
        proposal.updated_at = now()
        self._write(
            "INSERT OR REPLACE INTO proposals (id, run_id, status, created_at, body, patch_id,"
            " patch_hash, experiment_ids) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                proposal.id,
                proposal.run_id,
                proposal.status.value,
                proposal.created_at.isoformat(),
                body := self._body(proposal),
                *columns.proposal_values(orjson.loads(body)),
            ),
        )

    def get_proposal(self, proposal_id: str) -> ProposalRecord | None:
        return self._one(ProposalRecord, "SELECT body FROM proposals WHERE id=?", (proposal_id,))

    def proposals(
        self, run_id: str | None = None, status: ProposalStatus | None = None
    ) -> list[ProposalRecord]:
        sql, args = "SELECT body FROM proposals WHERE 1=1", []
        if run_id is not None:
            sql += " AND run_id=?"
            args.append(run_id)
        if status is not None:
            sql += " AND status=?"
            args.append(status.value)
        return self._many(ProposalRecord, sql + " ORDER BY created_at, id", tuple(args))

    def set_proposal_status(
        self, proposal_id: str, expected: ProposalStatus, new: ProposalStatus
    ) -> bool:
        with self.transaction():
            current = self.get_proposal(proposal_id)
            if current is None or current.status != expected:
                return False
            current.status = new
            self.put_proposal(current)
            return True

    def add_decision(self, decision: DecisionRecord) -> None:
        self._write(
            "INSERT INTO decisions (id, proposal_id, created_at, body, action, patch_hash)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                decision.id,
                decision.proposal_id,
                decision.created_at.isoformat(),
                body := self._body(decision),
                *columns.decision_values(orjson.loads(body)),
            ),
        )

    def decisions(self, proposal_id: str | None = None) -> list[DecisionRecord]:
        if proposal_id is None:
            return self._many(DecisionRecord, "SELECT body FROM decisions ORDER BY created_at, id")
        return self._many(
            DecisionRecord,
            "SELECT body FROM decisions WHERE proposal_id=? ORDER BY created_at, id",
            (proposal_id,),
        )
