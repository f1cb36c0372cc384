"""An attempt's run as one value that travels between a Ray node and the driver.

A node runs its attempt against a scratch run store of its own (`seed`: the run so far, when the
attempt continues); after each finished experiment and at the end it sends `read_bundle` of that
store to the driver, which alone writes the eval's run store (`merge`). The bundle holds every
record of the scratch store (the run, its steps, patches, experiments, re-measurements, feedback,
proposals, decisions) and the run's latest LangGraph checkpoint with its pending writes, so the
driver's store can continue the run anywhere: on another node after this one is lost, or locally
with `eval --resume`. Merging is idempotent (records by id; steps past those already stored).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.agent.runner import checkpoint_path
from infra_agent.private import private_sqlite
from infra_agent.store import open_store
from infra_agent.store.records import (
    DecisionRecord,
    ExperimentRecord,
    FeedbackRecord,
    PatchRecord,
    ProposalRecord,
    RunRecord,
    StepRecord,
)

_CHECKPOINT_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '', checkpoint_id TEXT NOT NULL,
    parent_checkpoint_id TEXT, type TEXT, checkpoint BLOB, metadata BLOB,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id));
CREATE TABLE IF NOT EXISTS writes (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL DEFAULT '', checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL, task_path TEXT NOT NULL DEFAULT '', idx INTEGER NOT NULL,
    channel TEXT NOT NULL, type TEXT, value BLOB,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx));
"""
"""LangGraph's SqliteSaver tables (langgraph-checkpoint-sqlite), so either side can be first."""

_CHECKPOINT_COLUMNS = ("thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id",
                       "type", "checkpoint", "metadata")  # fmt: skip
_WRITE_COLUMNS = ("thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "task_path", "idx",
                  "channel", "type", "value")  # fmt: skip


class CheckpointRows(BaseModel):
    """The run's latest checkpoint and its pending writes, as LangGraph stored them."""

    checkpoint: list[Any]
    writes: list[list[Any]] = Field(default_factory=list)


class RunBundle(BaseModel):
    """Every record of one attempt's run, and where its graph stands."""

    run: RunRecord
    steps: list[StepRecord] = Field(default_factory=list)
    patches: list[PatchRecord] = Field(default_factory=list)
    experiments: list[ExperimentRecord] = Field(default_factory=list)
    """The run's experiments and its best win's re-measurement (stored without a run)."""
    feedback: list[FeedbackRecord] = Field(default_factory=list)
    proposals: list[ProposalRecord] = Field(default_factory=list)
    decisions: list[DecisionRecord] = Field(default_factory=list)
    checkpoint: CheckpointRows | None = None
    """None: the run has none (finished runs' checkpoints are deleted)."""

    @property
    def finished_experiments(self) -> int:
        return sum(1 for e in self.experiments if e.run_id == self.run.id)


def _checkpoint_conn(store_path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(private_sqlite(checkpoint_path(store_path))), timeout=30)
    conn.executescript(_CHECKPOINT_SCHEMA)
    return conn


def _latest_checkpoint(store_path: Path, run_id: str) -> CheckpointRows | None:
    conn = _checkpoint_conn(store_path)
    try:
        row = conn.execute(
            f"SELECT {', '.join(_CHECKPOINT_COLUMNS)} FROM checkpoints WHERE thread_id = ? "
            "AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1",
            (run_id,),
        ).fetchone()
        if row is None:
            return None
        writes = conn.execute(
            f"SELECT {', '.join(_WRITE_COLUMNS)} FROM writes WHERE thread_id = ? "
            "AND checkpoint_ns = '' AND checkpoint_id = ? ORDER BY task_id, idx",
            (run_id, row[2]),
        ).fetchall()
        return CheckpointRows(checkpoint=list(row), writes=[list(w) for w in writes])
    finally:
        conn.close()


def _put_checkpoint(store_path: Path, run_id: str, rows: CheckpointRows | None) -> None:
    """Replace the run's checkpoints with `rows` (none: delete them, the run is done)."""
    conn = _checkpoint_conn(store_path)
    try:
        with conn:
            conn.execute("DELETE FROM checkpoints WHERE thread_id = ?", (run_id,))
            conn.execute("DELETE FROM writes WHERE thread_id = ?", (run_id,))
            if rows is not None:
                marks = ", ".join("?" * len(_CHECKPOINT_COLUMNS))
                conn.execute(
                    f"INSERT INTO checkpoints ({', '.join(_CHECKPOINT_COLUMNS)}) VALUES ({marks})",
                    rows.checkpoint,
                )
                marks = ", ".join("?" * len(_WRITE_COLUMNS))
                conn.executemany(
                    f"INSERT INTO writes ({', '.join(_WRITE_COLUMNS)}) VALUES ({marks})",
                    rows.writes,
                )
    finally:
        conn.close()


def read_bundle(
    store_path: Path, run_id: str, *, whole_store: bool = False, patch_ids: Iterable[str] = ()
) -> RunBundle:
    """The run's records from `store_path`. `whole_store`: every experiment, feedback and
    proposal in the file (a node's scratch store holds one attempt only: its re-measurement,
    stored without a run, comes too). Patches: those its experiments and proposals name, and
    `patch_ids` (the run's state lists the ones registered and not yet measured)."""
    store = open_store(store_path, readonly=True)
    try:
        run = store.get_run(run_id)
        if run is None:
            raise LookupError(f"run {run_id} is not in {store_path}")
        experiments = store.experiments(None if whole_store else run_id)
        proposals = store.proposals(None if whole_store else run_id)
        wanted = {e.patch_id for e in experiments} | {p.patch_id for p in proposals}
        wanted |= set(patch_ids)
        patches = [p for i in sorted(wanted) if (p := store.get_patch(i)) is not None]
        bundle = RunBundle(
            run=run,
            steps=store.steps(run_id),
            patches=patches,
            experiments=experiments,
            feedback=store.feedback(None if whole_store else run_id),
            proposals=proposals,
            decisions=[d for p in proposals for d in store.decisions(p.id)],
        )
    finally:
        store.close()
    bundle.checkpoint = _latest_checkpoint(store_path, run_id)
    return bundle


def merge(store_path: Path, bundle: RunBundle, *, task_root: str | None = None) -> None:
    """Write the bundle into the run store at `store_path` (idempotent), its checkpoint beside
    it. `task_root`: where the task's folder is on this machine (the run's config names the
    folder on the machine that sent it)."""
    run = bundle.run.model_copy(deep=True)
    if task_root is not None:
        run.config = {**run.config, "task_root": task_root}
    store = open_store(store_path)
    try:
        with store.transaction():
            for patch in bundle.patches:
                store.put_patch(patch)
            store.put_run(run)
            have = len(store.steps(run.id))
            for step in bundle.steps[have:]:
                store.add_step(step)
            for experiment in bundle.experiments:
                store.put_experiment(experiment)
            for feedback in bundle.feedback:
                store.put_feedback(feedback)
            for proposal in bundle.proposals:
                store.put_proposal(proposal)
            known = {d.id for p in bundle.proposals for d in store.decisions(p.id)}
            for decision in bundle.decisions:
                if decision.id not in known:
                    store.add_decision(decision)
    finally:
        store.close()
    _put_checkpoint(store_path, run.id, bundle.checkpoint)


seed = merge
"""A node's scratch store starts as the driver's copy of the run: the same write."""
