"""A run killed (SIGKILL) in the middle of an experiment resumes with `--resume` and finishes
without repeating the experiments it had completed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra_agent.errors import StoreError
from infra_agent.store import open_store


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "infra_agent.cli", *args]


def _started(db: Path) -> tuple[str | None, int, int]:
    """(run id, experiments finished, experiments started) as the store shows them now."""
    if not db.exists():
        return None, 0, 0
    try:
        store = open_store(db, readonly=True)
    except StoreError:  # the CLI has created the file but not yet its tables
        return None, 0, 0
    try:
        runs = store.list_runs()
        if not runs:
            return None, 0, 0
        run_id = runs[0].id
        started = sum(1 for s in store.steps(run_id) if s.name == "experiment")
        return run_id, len(store.experiments(run_id)), started
    finally:
        store.close()


@pytest.mark.slow
def test_killed_mid_experiment_resumes_without_repeating_finished_ones(
    quick_task: Path, tmp_path: Path
) -> None:
    db = tmp_path / "runs.db"
    proc = subprocess.Popen(
        _cli("--db", str(db), "optimize", "--task", str(quick_task), "--policy", "search", "--budget", "2"),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            run_id, finished, started = _started(db)
            if finished == 1 and started == 2:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.5)
        else:
            pytest.fail("the second experiment never started")
        time.sleep(2.0)  # well inside the second experiment
        assert _started(db)[1] == 1
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert run_id is not None

    resumed = subprocess.run(
        _cli("--db", str(db), "optimize", "--resume", run_id, "--json"),
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    outcome = json.loads(resumed.stdout)
    assert outcome["run_id"] == run_id and outcome["status"] in ("finished", "waiting_review")
    assert len(outcome["experiments"]) == 2

    store = open_store(db)
    experiments = store.experiments(run_id)
    assert len(experiments) == 2 and len({e.patch_id for e in experiments}) == 2
    started = [s.content.rsplit(" ", 1)[1] for s in store.steps(run_id) if s.name == "experiment"]
    first, second = experiments[0].patch_id, experiments[1].patch_id
    assert started.count(first) == 1  # finished before the kill: not repeated
    assert started.count(second) == 2  # killed mid-way: run again
    run = store.get_run(run_id)
    assert run is not None and run.status.value in ("finished", "waiting_review")
