"""A run store written by the previous schema (version 2) opens and exports as it is."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from trajectory_store import ENV_SECRET, SECRET_ENV, SECRETS

from infra_agent.store import open_store
from infra_agent.store.records import STORE_SCHEMA_VERSION, StepRecord
from infra_agent.trajectories.arrow import read_rows
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ExportFormat

LEGACY = Path(__file__).parent / "data" / "schema2.db"
"""A store written by infra-agent's schema-2 code (which also kept export columns and a
`step_calls` table): `trajectory_store.build_store`, run ids in schema2.json."""


def test_a_schema_2_store_opens_and_exports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Existing users' data: read as it is, exported in every format (the extra columns and
    table ignored); a writer bumps the version (the old code then refuses the file rather than
    miss rows without its columns) and new records are read back with the old ones."""
    monkeypatch.setenv(SECRET_ENV, ENV_SECRET)
    ids = json.loads(LEGACY.with_suffix(".json").read_text())
    db = tmp_path / "runs.db"
    shutil.copy(LEGACY, db)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta").fetchone() == ("2",)
        assert conn.execute("SELECT count(*) FROM step_calls").fetchone()[0] > 0
    reader = open_store(db, readonly=True)
    assert [r.id for r in reader.iter_runs()] == [ids["run_a"], ids["run_b"], ids["run_c"]]
    assert len(reader.steps(ids["run_a"])) == 11 and len(reader.experiments(ids["run_a"])) == 4
    for fmt in ExportFormat:
        for parquet in (False, True):
            out = tmp_path / f"{fmt.value}-{parquet}"
            summary = export_dataset(reader, fmt, out, parquet=parquet)
            assert summary.rows == (3 if fmt is ExportFormat.ATIF else 2)
            rows = read_rows(out)
            assert not [s for s in SECRETS if s in json.dumps(rows)]
    (row,) = [r for r in read_rows(tmp_path / "atif-True") if r["session_id"] == ids["run_a"]]
    verdicts = [e["verdict"] for p in row["extra"]["patches"] for e in p["experiments"]]
    assert verdicts == ["IMPROVED", "REJECTED", "INCORRECT", "IMPROVED"]
    assert row["final_metrics"]["extra"]["reviewed"] is True
    writer = open_store(db)
    writer.add_step(StepRecord(run_id=ids["run_b"], role="assistant", content="later"))
    writer.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta").fetchone() == (str(STORE_SCHEMA_VERSION),)
    assert [s.content for s in open_store(db, readonly=True).steps(ids["run_b"])][-1] == "later"
