"""Export columns of the SQLite run store: the fields exports read, kept beside each JSON body.

Exports of many runs read a few fields of every step and experiment. Picking them out of JSON
bodies costs far more than the Parquet writing they feed (about 80 us per run of 11 steps to
parse the bodies, 30 us for SQLite's `json_extract` of an experiment's fields), so since store
schema version 2 each step and experiment row also holds those fields as typed SQL columns,
written with the body (from the same redacted JSON, so the two always agree):

- `steps`: role, content, reasoning_content, tool_call_id, error, prompt_tokens,
  completion_tokens, cost_usd, and n_calls; each tool call is a row of `step_calls` (run_id, seq,
  idx, id, name, arguments), arguments as the model wrote them;
- `experiments`: patch_id, verdict, flags (JSON text, NULL when there are none), metric,
  speedup, ci_low, ci_high, passed, baseline_err_f64, candidate_err_f64;
- `proposals`: patch_id, patch_hash, experiment_ids (JSON text); `decisions`: action,
  patch_hash (beside the id, run, status and proposal columns they always had).

A store written by an older infra-agent gains the columns (filled from the bodies, in one
transaction) the first time a writer opens it; read-only openers of an older file see
`has_columns` False and exports fall back to the bodies.

`ColumnReader` reads these columns for many runs straight into Arrow through ADBC's SQLite
driver (`adbc-driver-sqlite`): no Python object per value, about a third of the cost of the same
query through `sqlite3`; a batch's steps become one struct array (`step_type`). ADBC infers a
column's type from the first rows it reads, so each query (but the calls', whose columns are
never NULL) starts with a row of non-null values of every column's type, dropped here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra_agent.errors import StoreError

if TYPE_CHECKING:  # pyarrow is only needed by exports; the store itself works without it
    import numpy as np
    import pyarrow as pa

COLUMNS_SCHEMA_VERSION = 2
"""The store schema version that added the export columns."""

STEP_COLUMNS = (
    ("role", "TEXT"),
    ("content", "TEXT"),
    ("reasoning_content", "TEXT"),
    ("tool_call_id", "TEXT"),
    ("error", "TEXT"),
    ("prompt_tokens", "INTEGER"),
    ("completion_tokens", "INTEGER"),
    ("cost_usd", "REAL"),
)
"""The step body's fields kept as columns (name, SQL type), in `STEP_TYPE` order but for
tool_calls."""

EXPERIMENT_COLUMNS = (
    ("patch_id", "$.patch_id", "TEXT"),
    ("verdict", "$.result.verdict", "TEXT"),
    ("flags", "$.result.flags", "TEXT"),
    ("metric", "$.result.evidence.performance.metric", "TEXT"),
    ("speedup", "$.result.evidence.performance.speedup", "REAL"),
    ("ci_low", "$.result.evidence.performance.ci_low", "REAL"),
    ("ci_high", "$.result.evidence.performance.ci_high", "REAL"),
    ("passed", "$.result.evidence.correctness.passed", "INTEGER"),
    ("baseline_err_f64", "$.result.evidence.correctness.baseline_err_f64", "REAL"),
    ("candidate_err_f64", "$.result.evidence.correctness.candidate_err_f64", "REAL"),
)
"""The experiment body's fields kept as columns: (column, JSON path in the body, SQL type)."""

EXPERIMENT_FIELDS = ("$.id", *(path for _, path, _ in EXPERIMENT_COLUMNS))
"""What `SQLiteRunStore.experiment_columns_of_runs` gives per experiment, as JSON paths of its
body: the id, then `EXPERIMENT_COLUMNS` in order."""
_PASSED = EXPERIMENT_FIELDS.index("$.result.evidence.correctness.passed")
_FLAGS = EXPERIMENT_FIELDS.index("$.result.flags")


PROPOSAL_COLUMNS = (
    ("patch_id", "$.patch_id"),
    ("patch_hash", "$.patch_hash"),
    ("experiment_ids", "$.experiment_ids"),
)
DECISION_COLUMNS = (("action", "$.action"), ("patch_hash", "$.patch_hash"))
PROPOSAL_FIELDS = ("$.id", "$.run_id", "$.patch_id", "$.patch_hash", "$.experiment_ids", "$.status")
"""What `SQLiteRunStore.review_columns` gives per proposal, as JSON paths of its body."""
DECISION_FIELDS = ("$.proposal_id", "$.action", "$.patch_hash")
"""What `SQLiteRunStore.review_columns` gives per decision, as JSON paths of its body."""
REVIEW_QUERIES = (
    "SELECT '' AS created_at, '' AS id, '' AS run_id, '' AS patch_id, '' AS patch_hash,"
    " '' AS experiment_ids, '' AS status UNION ALL SELECT created_at, id, run_id, patch_id,"
    " patch_hash, experiment_ids, status FROM proposals ORDER BY 1, 2",
    "SELECT '' AS created_at, '' AS id, '' AS proposal_id, '' AS action, '' AS patch_hash"
    " UNION ALL SELECT created_at, id, proposal_id, action, patch_hash FROM decisions"
    " ORDER BY 1, 2",
)
"""Every proposal and every decision (created_at, then id), each after a row of types (see
`_STEP_QUERY`): created_at, then `PROPOSAL_FIELDS` / id and `DECISION_FIELDS`, from the columns
(experiment_ids as JSON text)."""


def migration() -> list[str]:
    """The statements that add the export columns to a version-1 store and fill them from the
    bodies (run inside the opener's transaction)."""
    steps = [f"ALTER TABLE steps ADD COLUMN {name} {kind}" for name, kind in STEP_COLUMNS]
    fill_steps = ", ".join(f"{name} = json_extract(body, '$.{name}')" for name, _ in STEP_COLUMNS)
    experiments = [f"ALTER TABLE experiments ADD COLUMN {c} {k}" for c, _, k in EXPERIMENT_COLUMNS]
    fill_experiments = ", ".join(
        f"{c} = json_extract(body, '{p}')" for c, p, _ in EXPERIMENT_COLUMNS if c != "flags"
    )
    review = [
        *(f"ALTER TABLE proposals ADD COLUMN {c} TEXT" for c, _ in PROPOSAL_COLUMNS),
        "UPDATE proposals SET "
        + ", ".join(f"{c} = json_extract(body, '{p}')" for c, p in PROPOSAL_COLUMNS),
        *(f"ALTER TABLE decisions ADD COLUMN {c} TEXT" for c, _ in DECISION_COLUMNS),
    ]
    fill_decisions = ", ".join(f"{c} = json_extract(body, '{p}')" for c, p in DECISION_COLUMNS)
    return [
        *review,
        # Decisions are append-only (triggers refuse UPDATE): fill them with the trigger away.
        "DROP TRIGGER IF EXISTS decisions_append_only_u",
        f"UPDATE decisions SET {fill_decisions}",
        "CREATE TRIGGER decisions_append_only_u BEFORE UPDATE ON decisions"
        " BEGIN SELECT RAISE(ABORT, 'decisions are append-only'); END",
        *steps,
        "ALTER TABLE steps ADD COLUMN n_calls INTEGER NOT NULL DEFAULT 0",
        f"UPDATE steps SET {fill_steps}, "
        "n_calls = COALESCE(json_array_length(body, '$.tool_calls'), 0)",
        "CREATE TABLE step_calls (run_id TEXT NOT NULL, seq INTEGER NOT NULL, idx INTEGER NOT NULL,"
        " id TEXT NOT NULL, name TEXT NOT NULL, arguments TEXT NOT NULL,"
        " PRIMARY KEY (run_id, seq, idx)) WITHOUT ROWID",
        "INSERT INTO step_calls SELECT s.run_id, s.seq, c.key, json_extract(c.value, '$.id'),"
        " json_extract(c.value, '$.name'), json_extract(c.value, '$.arguments')"
        " FROM steps s, json_each(s.body, '$.tool_calls') c",
        *experiments,
        f"UPDATE experiments SET {fill_experiments}, flags = CASE"
        " WHEN COALESCE(json_array_length(body, '$.result.flags'), 0) = 0 THEN NULL"
        " ELSE json_extract(body, '$.result.flags') END",
    ]


STEP_INSERT = (
    "INSERT INTO steps (run_id, seq, body, "
    + ", ".join(name for name, _ in STEP_COLUMNS)
    + ", n_calls) VALUES (?, ?, ?, "
    + ", ".join("?" for _ in STEP_COLUMNS)
    + ", ?)"
)
CALL_INSERT = (
    "INSERT INTO step_calls (run_id, seq, idx, id, name, arguments) VALUES (?, ?, ?, ?, ?, ?)"
)


def proposal_values(body: dict[str, Any]) -> list[Any]:
    """A stored proposal body's `PROPOSAL_COLUMNS` values (experiment_ids as JSON text)."""
    import orjson

    return [body["patch_id"], body["patch_hash"], orjson.dumps(body["experiment_ids"]).decode()]


def decision_values(body: dict[str, Any]) -> list[Any]:
    """A stored decision body's `DECISION_COLUMNS` values."""
    return [body["action"], body["patch_hash"]]


def step_values(body: dict[str, Any]) -> list[Any]:
    """A stored step body's `STEP_COLUMNS` values and its number of tool calls."""
    return [*(body.get(name) for name, _ in STEP_COLUMNS), len(body.get("tool_calls") or ())]


def call_rows(body: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The `step_calls` rows of a stored step body."""
    return [
        (body["run_id"], body["seq"], k, c["id"], c["name"], c["arguments"])
        for k, c in enumerate(body.get("tool_calls") or ())
    ]


def experiment_fields(body: dict[str, Any]) -> list[Any]:
    """A stored experiment body's values at `EXPERIMENT_FIELDS` (None where absent)."""
    result = body["result"]
    evidence = result.get("evidence") or {}
    perf = evidence.get("performance") or {}
    corr = evidence.get("correctness") or {}
    return [
        body["id"], body["patch_id"], result["verdict"], result.get("flags"),
        perf.get("metric"), perf.get("speedup"), perf.get("ci_low"), perf.get("ci_high"),
        corr.get("passed"), corr.get("baseline_err_f64"), corr.get("candidate_err_f64"),
    ]  # fmt: skip


def experiment_values(body: dict[str, Any]) -> list[Any]:
    """A stored experiment body's `EXPERIMENT_COLUMNS` values (`experiment_fields` but the id;
    flags as JSON text, None when there are none)."""
    import orjson

    values = experiment_fields(body)[1:]
    flags = values[_FLAGS - 1]
    values[_FLAGS - 1] = orjson.dumps(flags).decode() if flags else None
    return values


EXPERIMENT_INSERT = (
    "INSERT OR REPLACE INTO experiments (id, run_id, started_at, body, "
    + ", ".join(c for c, _, _ in EXPERIMENT_COLUMNS)
    + ") VALUES (?, ?, ?, ?, "
    + ", ".join("?" for _ in EXPERIMENT_COLUMNS)
    + ")"
)


_TYPED = {"TEXT": "''", "INTEGER": "0", "REAL": "0.0"}
"""A non-null value of each SQL type: the first row of a column query (see `_STEP_QUERY`)."""
_EXPERIMENT_QUERY = (
    "SELECT -1, '', '', '', "
    + ", ".join(_TYPED[kind] for _, _, kind in EXPERIMENT_COLUMNS)
    + " UNION ALL SELECT j.key, e.started_at, e.id, e.id, "
    + ", ".join(f"e.{c}" for c, _, _ in EXPERIMENT_COLUMNS)
    + " FROM json_each(?) j JOIN experiments e ON e.run_id = j.value ORDER BY 1, 2, 3"
)
"""The experiments of the runs in a JSON array, in its order, each run's in
`experiments_of_runs` order (started_at, then id), after a row of types; the id twice (the
first for the order, the second is `EXPERIMENT_FIELDS`' first)."""


@dataclass
class StepColumns:
    """The steps of many runs, end to end in the order the runs were asked for."""

    steps: pa.StructArray
    """One `STEP_TYPE` value per step."""
    counts: np.ndarray
    """Steps per run (int64), in the runs' order."""


_STEP_QUERY = (
    "SELECT -1 AS k, -1 AS seq, "
    + ", ".join(_TYPED[kind] for _, kind in STEP_COLUMNS)
    + ", 0 UNION ALL SELECT j.key, s.seq, "
    + ", ".join(f"s.{name}" for name, _ in STEP_COLUMNS)
    + ", s.n_calls FROM json_each(?) j JOIN steps s ON s.run_id = j.value"
)
"""The steps of the runs in a JSON array, after one row of non-null values of each column's
type: ADBC infers a column's type from the first rows it reads, and a column of NULLs there (no
step of the first runs had an error) would be read as integers. No ORDER BY: SQLite's plan
(the array's elements in order, each run's steps by the primary key) gives the runs' order
without sorting every row's text (about 15% of the query); `_in_order` checks it."""
_CALL_QUERY = (
    "SELECT j.key, c.seq, c.idx, c.id, c.name, c.arguments FROM json_each(?) j"
    " JOIN step_calls c ON c.run_id = j.value"
)
"""The tool calls of the runs in a JSON array (run, step, then call order: `_in_order`)."""
_BATCH_ROWS = {"adbc.sqlite.query.batch_rows": "65536"}
"""Rows per Arrow batch ADBC reads: a batch's query comes back in one (at 8,192 rows it came in
several, joined afterwards, and read about 12% slower)."""
MMAP_BYTES = 1 << 30
"""How much of the store file the export reader maps into memory (SQLite's `mmap_size`): the
column queries then read pages in place instead of copying each out of the file (about 15% of
a batch's step query). Only this read-only connection maps the file; SQLite keeps it correct
under concurrent writers (WAL), and a file larger than this is read past it as usual."""


def step_type() -> pa.StructType:
    """The Arrow type of one step: the fields of a step body the chat rows read."""
    import pyarrow as pa

    call = pa.struct([("id", pa.string()), ("name", pa.string()), ("arguments", pa.string())])
    return pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("reasoning_content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
            ("error", pa.string()),
            ("prompt_tokens", pa.int64()),
            ("completion_tokens", pa.int64()),
            ("cost_usd", pa.float64()),
        ]
    )


def one_array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A query result's column as one array (no copy when it came as one batch)."""
    import pyarrow as pa

    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def experiment_rows(table: pa.Table) -> list[list[Any]]:
    """The rows of an `ColumnReader.experiment_table` as the values at `EXPERIMENT_FIELDS` of
    each body, as `json_extract` would give them (flags a list, passed a bool, None where
    absent); the `run` column left out."""
    import orjson

    values = [table.column(k).to_pylist() for k in range(1, table.num_columns)]
    values[_FLAGS] = [orjson.loads(f) if f is not None else [] for f in values[_FLAGS]]
    values[_PASSED] = [bool(p) if p is not None else None for p in values[_PASSED]]
    return [list(row) for row in zip(*values, strict=True)]


def _in_order(table: pa.Table, n_keys: int) -> pa.Table:
    """`table` sorted by its first `n_keys` (integer) columns: as it is when they already
    increase (the query plan's order), else sorted here (any other plan)."""
    import numpy as np

    if table.num_rows < 2:
        return table
    keys = np.stack([table.column(k).to_numpy() for k in range(n_keys)], axis=1)
    step = np.diff(keys, axis=0)
    # Lexicographic increase: the first non-zero difference of each pair of rows is positive.
    first = np.argmax(step != 0, axis=1)
    if (step[np.arange(len(step)), first] > 0).all():
        return table
    names = table.column_names[:n_keys]
    return table.sort_by([(name, "ascending") for name in names])


class ColumnReader:
    """Reads the export columns of a store file through ADBC (one connection, opened lazily)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: Any = None

    @staticmethod
    def available() -> bool:
        """Whether ADBC's SQLite driver and pyarrow are installed."""
        try:
            import adbc_driver_sqlite.dbapi  # noqa: F401
            import pyarrow  # noqa: F401
        except ImportError:
            return False
        return True

    def _tables(self, run_ids: Sequence[str] | None, *queries: str) -> list[pa.Table]:
        """The results of `queries` (each with one parameter, `run_ids` as a JSON array, unless
        None), in one read transaction: one snapshot of the file."""
        import json

        from adbc_driver_manager import Error as AdbcError

        if self._conn is None:
            import adbc_driver_sqlite.dbapi

            self._conn = adbc_driver_sqlite.dbapi.connect(str(self.path))
            with self._conn.cursor() as cursor:
                cursor.execute(f"PRAGMA mmap_size = {MMAP_BYTES}")
                cursor.fetchall()
        params = (json.dumps(list(run_ids)),) if run_ids is not None else None
        tables = []
        try:
            with self._conn.cursor() as cursor:
                cursor.adbc_statement.set_options(**_BATCH_ROWS)
                for query in queries:
                    cursor.execute(query, params)
                    tables.append(cursor.fetch_arrow_table())
        except AdbcError as exc:
            raise StoreError(
                f"run store {self.path}: cannot read its export columns ({exc})"
            ) from exc
        finally:
            self._conn.rollback()  # let go of the snapshot (and of the WAL it pins)
        return tables

    def experiment_table(self, run_ids: Sequence[str]) -> pa.Table:
        """The experiments of `run_ids` (distinct), runs in that order, each run's in
        `experiments_of_runs` order (started_at, then id): a column `run` (the run's index in
        `run_ids`), `id`, then `EXPERIMENT_COLUMNS` as stored (flags JSON text or null, passed
        0/1 or null)."""
        (table,) = self._tables(run_ids, _EXPERIMENT_QUERY)
        table = table.slice(1).select([0, *range(3, table.num_columns)])  # past the order keys
        return table.rename_columns(["run", "id", *(c for c, _, _ in EXPERIMENT_COLUMNS)])

    def experiments(self, run_ids: Sequence[str]) -> dict[str, list[list[Any]]]:
        """Run id -> per experiment of the run (started_at, then id), the values at
        `EXPERIMENT_FIELDS` of its body, as `json_extract` would give them (flags a list,
        passed a bool, None where absent)."""
        table = self.experiment_table(run_ids)
        out: dict[str, list[list[Any]]] = {}
        for key, picked in zip(table.column(0).to_pylist(), experiment_rows(table), strict=True):
            out.setdefault(run_ids[key], []).append(picked)
        return out

    def review_tables(self) -> tuple[pa.Table, pa.Table]:
        """Every proposal (`id`, `run_id`, `patch_id`, `patch_hash`, `experiment_ids` as JSON
        text, `status`) and every decision (`id`, `proposal_id`, `action`, `patch_hash`), each
        in created_at, then id order."""
        proposals, decisions = self._tables(None, *REVIEW_QUERIES)
        return (
            proposals.slice(1).drop_columns(["created_at"]),
            decisions.slice(1).drop_columns(["created_at"]),
        )

    def review(self) -> tuple[list[list[Any]], list[list[Any]]]:
        """`PROPOSAL_FIELDS` of every proposal, `DECISION_FIELDS` of every decision (each in
        created_at, then id order), as `json_extract` of the bodies would give them."""
        import orjson

        proposals, decisions = self.review_tables()
        fields = [
            [proposals.column(k).to_pylist() for k in range(proposals.num_columns)],
            [decisions.column(k).to_pylist() for k in range(1, decisions.num_columns)],
        ]
        experiment_ids = PROPOSAL_FIELDS.index("$.experiment_ids")
        texts = fields[0][experiment_ids]
        fields[0][experiment_ids] = orjson.loads("[" + ",".join(texts) + "]")  # one parse
        proposals_out = [list(v) for v in zip(*fields[0], strict=True)]
        return proposals_out, [list(v) for v in zip(*fields[1], strict=True)]

    def steps(self, run_ids: Sequence[str]) -> StepColumns:
        """The steps of `run_ids` (distinct ids), in that order, each run's in seq order."""
        import numpy as np
        import pyarrow as pa

        rows, calls = self._tables(run_ids, _STEP_QUERY, _CALL_QUERY)
        rows = _in_order(rows, 2)
        calls = _in_order(calls, 3).drop_columns(calls.column_names[:3])
        kind = step_type()
        if rows.num_rows == 1:  # the row of types alone
            return StepColumns(pa.array([], type=kind), np.zeros(len(run_ids), np.int64))
        columns = [one_array(c).slice(1) for c in rows.columns]  # after the row of types
        run_index = columns[0].to_numpy()
        counts = np.bincount(run_index, minlength=len(run_ids)).astype(np.int64)
        fields = {
            name: columns[at].cast(kind.field(name).type)
            for at, (name, _) in enumerate(STEP_COLUMNS, start=2)
        }
        at = 2 + len(STEP_COLUMNS)
        n_calls = columns[at].to_numpy()
        offsets = np.zeros(len(n_calls) + 1, dtype=np.int32)
        np.cumsum(n_calls, out=offsets[1:])
        call_type = kind.field("tool_calls").type
        call_fields = list(call_type.value_type)
        if calls.num_rows:
            values = pa.StructArray.from_arrays(
                [one_array(c).cast(pa.string()) for c in calls.columns], fields=call_fields
            )
        else:
            values = pa.array([], type=call_type.value_type)
        if len(values) != offsets[-1]:
            raise StoreError(f"run store {self.path}: step_calls disagree with steps.n_calls")
        fields["tool_calls"] = pa.ListArray.from_arrays(pa.array(offsets), values, type=call_type)
        steps = pa.StructArray.from_arrays([fields[f.name] for f in kind], fields=list(kind))
        return StepColumns(steps, counts)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
