"""A run killed (SIGKILL) in the middle of an experiment resumes with `--resume` and finishes
without repeating the experiments it had completed."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support import ExperimentGate

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
    # The second experiment waits at a gate: the run is killed while it is certainly in progress.
    gate = ExperimentGate(quick_task, tmp_path / "gate", from_nth=2)
    db, log = tmp_path / "runs.db", tmp_path / "run.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            _cli("--db", str(db), "optimize", "--task", str(quick_task), "--policy", "search", "--budget", "2"),
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        gate.wait_held(proc, log)
        run_id, finished, started = _started(db)
        assert (finished, started) == (1, 2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert run_id is not None
    gate.release()  # the resumed run passes it

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
    started_on = [
        s.content.rsplit(" ", 1)[1] for s in store.steps(run_id) if s.name == "experiment"
    ]
    first, second = experiments[0].patch_id, experiments[1].patch_id
    assert started_on.count(first) == 1  # finished before the kill: not repeated
    assert started_on.count(second) == 2  # killed mid-way: run again
    assert gate.started == 3  # the harness agrees: 1, 2 (killed), 2 again
    run = store.get_run(run_id)
    assert run is not None and run.status.value in ("finished", "waiting_review")


class Crash(Exception):
    """Stands for the process dying mid-run."""


def test_killed_after_a_step_saved_its_writes_but_before_its_checkpoint_resumes(
    quick_task: Path, tmp_path: Path
) -> None:
    """A kill between a step's saved writes and the next checkpoint: LangGraph's live state then
    lists no next node (the step's one task has finished), yet the run is not finished. The
    resume applies the saved writes and goes on; the finished tool call is not made again."""
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.agent.runner import checkpoint_path, resume_run, start_run
    from infra_agent.config import load_settings

    script = [
        {"content": "look", "tool_calls": [{"name": "describe_task"}]},
        {"content": "done", "tool_calls": [{"name": "finish", "arguments": {"summary": "seen"}}]},
    ]
    (tmp_path / "script.json").write_text(json.dumps(script))
    db = tmp_path / "runs.db"
    settings = load_settings(overrides={"store.db": str(db)})
    config = RunConfig(
        task=str(quick_task), policy="scripted", script=str(tmp_path / "script.json")
    )
    started: list[str] = []

    def crash_after_the_tools(values: dict[str, object]) -> None:
        if values.get("phase") == "tools":
            raise Crash("killed")

    with pytest.raises(Crash):
        start_run(config, settings, on_run=lambda run: started.append(run.id), on_state=crash_after_the_tools)  # fmt: skip
    [run_id] = started
    with sqlite3.connect(checkpoint_path(db)) as conn:  # the kill came before this checkpoint
        (last,) = conn.execute(
            "SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id=?", (run_id,)
        ).fetchone()
        conn.execute("DELETE FROM checkpoints WHERE thread_id=? AND checkpoint_id=?", (run_id, last))  # fmt: skip
        conn.execute("DELETE FROM writes WHERE thread_id=? AND checkpoint_id=?", (run_id, last))
        pending = conn.execute("SELECT count(*) FROM writes WHERE thread_id=?", (run_id,)).fetchone()  # fmt: skip
    assert pending[0] > 0  # the tools step's writes are still there

    outcome = resume_run(run_id, settings)
    assert outcome.status == "finished", outcome
    store = open_store(db, readonly=True)
    try:
        answers = [s for s in store.steps(run_id) if s.role == "tool" and s.name == "describe_task"]
        run = store.get_run(run_id)
    finally:
        store.close()
    assert len(answers) == 1  # the tools step ran once, before the kill
    assert run is not None and "the scripted policy called finish" in (run.summary or "")
