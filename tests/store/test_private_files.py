"""The run store is private, and making it private never costs SQLite its locks."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from infra_agent.private import private_sqlite
from infra_agent.store import open_store
from infra_agent.store.records import RunRecord

READ_AND_CLOSE = (
    "import sqlite3, sys\n"
    "conn = sqlite3.connect(sys.argv[1])\n"
    "print(conn.execute('SELECT count(*) FROM runs').fetchone()[0])\n"
    "conn.close()\n"
)


def _runs_seen_by_another_process(db: Path) -> int:
    done = subprocess.run(
        [sys.executable, "-c", READ_AND_CLOSE, str(db)], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


def test_store_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        db = tmp_path / "data" / "runs.db"
        store = open_store(db)
        store.put_run(RunRecord(task="t", objective="latency", policy="search"))
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in db.parent.iterdir()}
        store.close()
    finally:
        os.umask(old)
    assert modes == {"runs.db": 0o600, "runs.db-wal": 0o600, "runs.db-shm": 0o600}
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700


def test_reopening_an_open_store_keeps_its_locks(tmp_path: Path) -> None:
    # Closing any descriptor of a file drops this process's POSIX locks on it. If making the
    # store private opened the file, another process closing its last connection would think
    # nobody else has the store open, delete the WAL, and this process's writes would vanish.
    db = tmp_path / "runs.db"
    store = open_store(db)
    store.put_run(RunRecord(task="t", objective="latency", policy="search"))
    private_sqlite(db)  # what a second open_store in this process does first
    assert _runs_seen_by_another_process(db) == 1
    store.put_run(RunRecord(task="t", objective="latency", policy="search"))
    assert _runs_seen_by_another_process(db) == 2
    store.close()


def test_the_eval_store_keeps_the_run_store_file_private(tmp_path: Path) -> None:
    """Evals share the run store's file; opening it first must not create it readable."""
    from infra_agent.evals.records import EvalStore

    old = os.umask(0)
    try:
        db = tmp_path / "data" / "runs.db"
        db.parent.mkdir(mode=0o700)
        evals = EvalStore(db)
        evals.conn.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
