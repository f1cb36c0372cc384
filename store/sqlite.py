"""SQLite implementation of the run store: one file, WAL mode, transactional writes.

Each record is stored whole as JSON in `body`, with the columns needed for lookups beside it.
The schema version lives in `meta`; a database written by a newer infra-agent is refused. A
version-2 file (which also kept export columns and a `step_calls` table) opens as it is: those
are ignored, and a writer bumps the version (see `records.STORE_SCHEMA_VERSION`).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

from infra_agent.errors import StoreError
from infra_agent.private import private_sqlite
from infra_agent.redact import redact_text
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
            self._open_schema(conn, readonly)
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

    def _open_schema(self, conn: sqlite3.Connection, readonly: bool) -> None:
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
            return
        with self.transaction():
            for statement in _SCHEMA.split(";\n"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(STORE_SCHEMA_VERSION),),
            )

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
        """The bodies of `sql`'s rows as records, validated by one pydantic call on their JSON
        array (a third cheaper than one call per row)."""
        rows = self._conn().execute(sql, args).fetchall()
        return self._validated(model, "[" + ",".join(r[0] for r in rows) + "]")

    def _validated(self, model: type[R], array: str) -> list[R]:
        try:
            return _list_adapter(model).validate_json(array)
        except ValidationError as exc:
            raise StoreError(f"run store {self.path}: a {model.__name__} row is malformed") from exc

    @staticmethod
    def _body(record: BaseModel) -> str:
        """The JSON stored for a record, with secrets (API keys, tokens, secret env values)
        replaced by [REDACTED]: nothing secret is written in the first place. Patches are stored
        as they are (their id is the hash of their content) and so are not passed through here."""
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
        """Every run, oldest first (created_at, then id), read a chunk at a time."""
        cursor = self._conn().execute("SELECT body FROM runs ORDER BY created_at, id")
        while rows := cursor.fetchmany(500):
            yield from self._validated(RunRecord, "[" + ",".join(r[0] for r in rows) + "]")

    # -- steps ------------------------------------------------------------------------------
    def add_step(self, step: StepRecord) -> StepRecord:
        with self.transaction():
            conn = self._conn()
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), -1) FROM steps WHERE run_id=?", (step.run_id,)
            ).fetchone()
            stored = step.model_copy(update={"seq": int(row[0]) + 1})
            conn.execute(
                "INSERT INTO steps (run_id, seq, body) VALUES (?, ?, ?)",
                (stored.run_id, stored.seq, self._body(stored)),
            )
        return stored

    def steps(self, run_id: str) -> list[StepRecord]:
        return self._many(
            StepRecord, "SELECT body FROM steps WHERE run_id=? ORDER BY seq", (run_id,)
        )

    # -- patches, experiments, feedback -------------------------------------------------------
    def put_patch(self, patch: PatchRecord) -> None:
        self._write(
            "INSERT OR IGNORE INTO patches (id, body) VALUES (?, ?)",
            (patch.id, patch.model_dump_json()),
        )

    def get_patch(self, patch_id: str) -> PatchRecord | None:
        return self._one(PatchRecord, "SELECT body FROM patches WHERE id=?", (patch_id,))

    def put_experiment(self, experiment: ExperimentRecord) -> None:
        self._write(
            "INSERT OR REPLACE INTO experiments (id, run_id, started_at, body) VALUES (?, ?, ?, ?)",
            (
                experiment.id,
                experiment.run_id,
                experiment.started_at.isoformat(),
                self._body(experiment),
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
            "INSERT OR REPLACE INTO proposals (id, run_id, status, created_at, body)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                proposal.id,
                proposal.run_id,
                proposal.status.value,
                proposal.created_at.isoformat(),
                self._body(proposal),
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

    def proposal_ids(self, status: ProposalStatus | None = None) -> list[str]:
        where = "" if status is None else " WHERE status=?"
        args: tuple[str, ...] = () if status is None else (status.value,)
        sql = f"SELECT id FROM proposals{where} ORDER BY created_at, id"
        return [r[0] for r in self._conn().execute(sql, args)]

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
            "INSERT INTO decisions (id, proposal_id, created_at, body) VALUES (?, ?, ?, ?)",
            (
                decision.id,
                decision.proposal_id,
                decision.created_at.isoformat(),
                self._body(decision),
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
