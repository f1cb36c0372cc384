"""Evaluations, stored in the run store: an eval and its attempts, each attempt linked to its run.

Two tables in the same SQLite file as the runs (`evals`, `eval_attempts`), each row a whole
record as JSON, like the other records. An attempt's id is `<eval id>/[<profile>/]<task>/<k>`, so
a resumed eval finds exactly the attempts it already made.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from infra_agent.private import private_sqlite
from infra_agent.store.records import Hardware, new_id, now

AttemptStatus = Literal["pending", "running", "finished", "failed", "not_applicable"]
TryOutcome = Literal["queued", "running", "finished", "lost", "failed", "cancelled"]


class Placement(BaseModel):
    """One try of an attempt on a Ray cluster (`eval --executor ray`): where it ran, on what,
    from which experiment it started and how it ended. A lost node gives a second try."""

    node_id: str = ""
    """Ray's node id (empty while queued)."""
    node: str = ""
    """The node as a person reads it: host name and IP address."""
    hardware: Hardware | None = None
    """What the node's machine reported (CPU model, cores, memory, GPUs)."""
    ray_resources: dict[str, float] = Field(default_factory=dict)
    """What the node offers Ray (CPU, GPU, memory in bytes, custom resources)."""
    requested: dict[str, float] = Field(default_factory=dict)
    """What this attempt asked for (num_cpus, num_gpus, memory in bytes)."""
    from_experiments: int = 0
    """Finished experiments of the run this try continued from (0: a fresh run)."""
    outcome: TryOutcome = "queued"
    detail: str = ""
    """Why it ended, when not finished (the node lost, the error)."""
    started_at: datetime | None = None
    ended_at: datetime | None = None


class FirstWin(BaseModel):
    """What an attempt spent until its first IMPROVED experiment."""

    turns: int
    experiments: int
    tokens: int
    cost_usd: float
    wall_s: float


class Reverification(BaseModel):
    """The attempt's best win measured once more, as a new experiment on fresh seeds."""

    experiment_id: str
    """The new experiment (stored without a run: the agent never saw it)."""
    of_experiment: str
    """The win it re-measured: the IMPROVED experiment with the highest 95% CI low end."""
    patch_id: str
    seed: int
    """The statistics' seed, one the run never used (input seeds are always fresh)."""
    verdict: str
    flags: list[str] = Field(default_factory=list)
    """The re-measurement's flags (e.g. 'suspicious')."""
    speedup: float | None = None
    ci_low: float | None = None
    disproved: bool
    """The re-measurement was not IMPROVED, or was flagged suspicious: the claim did not
    survive."""
    unverified: bool = False
    """The re-measurement's baseline arm failed on both tries (a server that did not start, a
    timeout): the claim was neither confirmed nor disproved."""
    reason: str = ""
    """Why the re-measurement was not IMPROVED, in its own words (its first reason)."""


class SetAsideReason(str, Enum):
    """Why an IMPROVED experiment does not count toward solving the task."""

    SUSPICIOUS = "suspicious"
    """Flagged suspicious (a gain above the task's plausibility bound, or one the metric's
    companion does not share): a person decides, not the eval."""
    NOT_HELD = "not held"
    """Re-measured on fresh seeds and not IMPROVED again (or flagged suspicious then)."""
    NOT_VERIFIED = "not verified"
    """The re-measurement could not run its baseline (twice): unchecked, so not counted, and
    not counted as disproved either."""


class SetAside(BaseModel):
    """A win the eval does not count as solved, and why."""

    experiment_id: str
    why: SetAsideReason
    speedup: float | None = None
    detail: str = ""
    """In words: the suspicious flag's reasons, or what the re-measurement found."""


class AttemptResult(BaseModel):
    """The numbers of one finished attempt, read from its run."""

    solved: bool
    """The task's own success criterion was met by one experiment: IMPROVED (correct, and better
    beyond the task's min_effect with a CI and a sign test that agree) with every target and
    constraint the task declares shown met (`experiments.criteria.success`), and not set aside
    (`set_aside`: flagged suspicious, or not IMPROVED again when re-measured)."""
    improved: bool | None = None
    """At least one experiment came out IMPROVED, set aside or not (None in records made when
    that was `solved`)."""
    best_speedup: float | None = None
    """The best IMPROVED experiment's ratio among those not set aside, oriented so > 1 is better
    (speedup, or the metric's change for accuracy and correctness tasks)."""
    set_aside: list[SetAside] = Field(default_factory=list)
    """IMPROVED experiments that count neither as solved nor in best_speedup, with why."""
    beats_best_known: bool | None = None
    """An open task (`[open]` in its task.toml) only: `best_speedup` (a win not set aside, so
    one that held when re-measured) is above the best result the task states as known. None for
    a task that states none."""
    true_success: bool | None = None
    """A solved attempt only (`evals.attempt.true_success`): on a task with an injected fault,
    whether a solving patch changes a function the fault lives in (False: a win elsewhere, a
    lucky one); on an open task, whether its best win held when re-measured. None otherwise."""
    criteria_met: list[bool] = Field(default_factory=list)
    """Per experiment, in order: whether it met the task's success criterion."""
    reverification: Reverification | None = None
    """None: no win to re-verify, or the eval skipped it (--no-reverify)."""
    verdicts: list[str] = Field(default_factory=list)
    speedups: list[float | None] = Field(default_factory=list)
    turns: int = 0
    experiments: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    invalid_calls: int = 0
    """Tool calls answered with an error (unknown tool, bad arguments, refused)."""
    rejected: int = 0
    """Patches the static rules refused (REJECTED)."""
    first_win: FirstWin | None = None
    tools: list[str] = Field(default_factory=list)
    """The tools the run offered its policy."""
    stop_reason: str | None = None


class EvalRecord(BaseModel):
    id: str = Field(default_factory=lambda: new_id("eval"))
    suite: str
    tasks: list[str]
    policy: str
    model: str | None = None
    profiles: list[str] = Field(default_factory=list)
    """The LLM profiles compared (`--model`, each attempt runs with one); empty: the settings'
    own endpoint or profile."""
    feedback: Literal["dense", "sparse"] = "dense"
    attempts: int = 1
    reverify: bool = True
    """Re-measure each attempt's best win on fresh seeds (claims disproved)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """What every attempt's run is started with (budget, sandbox, script, ...)."""
    status: Literal["running", "finished", "interrupted"] = "running"
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)


class AttemptRecord(BaseModel):
    id: str
    eval_id: str
    task: str
    index: int
    profile: str | None = None
    """The LLM profile this attempt's run uses (None: the settings' own)."""
    status: AttemptStatus = "pending"
    run_id: str | None = None
    abandoned_runs: list[str] = Field(default_factory=list)
    """Runs of this attempt killed before their first checkpoint (started again)."""
    reason: str = ""
    result: AttemptResult | None = None
    placements: list[Placement] = Field(default_factory=list)
    """Its tries on a Ray cluster, in order (empty when it ran locally); more than one: retried
    after a node was lost."""
    updated_at: datetime = Field(default_factory=now)

    @staticmethod
    def make_id(eval_id: str, task: str, index: int, profile: str | None = None) -> str:
        return f"{eval_id}/{profile + '/' if profile else ''}{task}/{index}"


_SCHEMA = """
CREATE TABLE IF NOT EXISTS evals (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS eval_attempts (
    id TEXT PRIMARY KEY, eval_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS eval_attempts_by_eval ON eval_attempts (eval_id, seq);
"""


class EvalStore:
    """Evals and attempts in the run store's SQLite file (its own connection, WAL like the rest)."""

    def __init__(self, path: Path, *, readonly: bool = False) -> None:
        self.path = path
        uri = f"file:{path}?mode=ro" if readonly else f"file:{private_sqlite(path)}"
        self.conn = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None)
        if not readonly:
            self.conn.executescript(_SCHEMA)

    def _has_tables(self) -> bool:
        row = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='evals'"
        ).fetchone()
        return row is not None

    def put_eval(self, record: EvalRecord) -> None:
        record.updated_at = now()
        self.conn.execute(
            "INSERT INTO evals (id, body) VALUES (?, ?) "
            "ON CONFLICT (id) DO UPDATE SET body = excluded.body",
            (record.id, record.model_dump_json()),
        )

    def get_eval(self, eval_id: str) -> EvalRecord | None:
        if not self._has_tables():
            return None
        row = self.conn.execute("SELECT body FROM evals WHERE id = ?", (eval_id,)).fetchone()
        return EvalRecord.model_validate_json(row[0]) if row else None

    def list_evals(self) -> list[EvalRecord]:
        if not self._has_tables():
            return []
        rows = self.conn.execute("SELECT body FROM evals").fetchall()
        found = [EvalRecord.model_validate_json(r[0]) for r in rows]
        return sorted(found, key=lambda e: e.created_at, reverse=True)

    def put_attempt(self, record: AttemptRecord) -> None:
        record.updated_at = now()
        self.conn.execute(
            "INSERT INTO eval_attempts (id, eval_id, seq, body) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET body = excluded.body",  # keeps the row's order
            (record.id, record.eval_id, record.index, record.model_dump_json()),
        )

    def attempts(self, eval_id: str) -> list[AttemptRecord]:
        if not self._has_tables():
            return []
        rows = self.conn.execute(
            "SELECT body FROM eval_attempts WHERE eval_id = ? ORDER BY rowid", (eval_id,)
        ).fetchall()
        return [AttemptRecord.model_validate_json(r[0]) for r in rows]

    def close(self) -> None:
        self.conn.close()


def eval_run_ids(path: Path, eval_id: str) -> list[str]:
    """The runs of an eval's attempts, in attempt order (UserError if the eval is unknown or has
    no run yet)."""
    from infra_agent.errors import UserError

    if not path.exists():
        raise UserError(f"no run store at {path}")
    store = EvalStore(path, readonly=True)
    try:
        if store.get_eval(eval_id) is None:
            raise UserError(f"no eval '{eval_id}' in {path}")
        runs = [a.run_id for a in store.attempts(eval_id) if a.run_id]
    finally:
        store.close()
    if not runs:
        raise UserError(f"eval {eval_id} has no runs yet")
    return runs
