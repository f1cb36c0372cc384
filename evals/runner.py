"""Run an eval: every task of the suite, K attempts each, one agent run per attempt.

Each attempt is recorded before its run starts and linked to the run as soon as the run exists;
a finished attempt is never run again. On resume (`infra-agent eval --resume EVAL_ID`) an attempt
whose run was interrupted continues that run from its last checkpoint (the agent's own resume),
and one killed before its run's first checkpoint starts a fresh run (the dead one is listed as
abandoned). Attempt k runs with seed k, so attempts differ where the policy is stochastic.
With several LLM profiles (`--model A --model B`) each attempt runs with its own profile.
After a run finishes, its best win is re-measured once on fresh seeds (`evals.reverify`) unless
the eval was made with `--no-reverify`; the attempt is finished only after that, so a resumed
eval re-measures a win whose re-measurement was cut short and never one that was recorded.
`--parallel-attempts N` runs N attempts at once, each in its own process on its own CPU set
(`evals.parallel`); `--executor ray` runs each attempt as a Ray task on a cluster, the driver
writing the store (`evals.cluster`); one attempt's steps are in `evals.attempt`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra_agent.agent.configuration import RunConfig
from infra_agent.config import Settings
from infra_agent.errors import UserError
from infra_agent.evals.attempt import Progress, run_attempt
from infra_agent.evals.cluster import run_on_cluster
from infra_agent.evals.parallel import run_parallel
from infra_agent.evals.records import AttemptRecord, EvalRecord, EvalStore
from infra_agent.store import open_store


@dataclass
class ClusterOptions:
    """Attempts as Ray tasks (`eval --executor ray`)."""

    address: str | None = None
    """The cluster (`ray start --head` prints it); None: a private Ray on this machine."""
    on_board: Callable[[Any], None] | None = None
    """Called with the live table (`evals.board.Board`) after each poll."""


def create_eval(
    store_path: Path,
    *,
    suite: str,
    tasks: list[str],
    base: RunConfig,
    attempts: int,
    model: str | None,
    profiles: list[str] | None = None,
    reverify: bool = True,
) -> EvalRecord:
    """Record a new eval and its pending attempts (nothing runs yet): for each profile (or the
    settings' own endpoint), each task, K attempts."""
    if attempts < 1:
        raise UserError("--attempts: at least 1")
    profiles = profiles or []
    open_store(store_path).close()  # the run store's own schema first
    evals = EvalStore(store_path)
    try:
        record = EvalRecord(
            suite=suite,
            tasks=tasks,
            policy=base.policy,
            model=model,
            profiles=profiles,
            feedback=base.feedback,
            attempts=attempts,
            reverify=reverify,
            config=base.model_dump(mode="json", exclude={"task", "task_root", "tools"}),
        )
        evals.put_eval(record)
        each: list[str | None] = [*profiles] or [None]
        for profile in each:
            for task in tasks:
                for k in range(attempts):
                    evals.put_attempt(
                        AttemptRecord(
                            id=AttemptRecord.make_id(record.id, task, k, profile),
                            eval_id=record.id,
                            task=task,
                            index=k,
                            profile=profile,
                        )
                    )
        return record
    finally:
        evals.close()


def run_eval(
    eval_id: str,
    settings: Settings,
    progress: Progress = lambda text: None,
    parallel_attempts: int = 1,
    cluster: ClusterOptions | None = None,
) -> EvalRecord:
    """Run (or continue) every unfinished attempt of an eval: in order, or up to
    `parallel_attempts` at once, each in its own process on its own CPU set (evals.parallel),
    or each as a Ray task on a cluster (`cluster`, evals.cluster)."""
    store_path = settings.store.path()
    evals = EvalStore(store_path)
    try:
        record = evals.get_eval(eval_id)
        if record is None:
            raise UserError(f"no eval '{eval_id}' in {store_path}")
        record.status = "running"
        evals.put_eval(record)
        todo = [a for a in evals.attempts(eval_id) if a.status in ("pending", "running")]
        done = len(evals.attempts(eval_id)) - len(todo)
        total = done + len(todo)
        try:
            if cluster is not None:
                ids = [a.id for a in todo]
                run_on_cluster(eval_id, ids, settings, progress, cluster.address, cluster.on_board)
            elif parallel_attempts > 1:
                run_parallel(eval_id, [a.id for a in todo], settings, parallel_attempts, progress)
            for attempt in todo if parallel_attempts <= 1 and cluster is None else []:
                done += 1
                who = f"{attempt.profile}: " if attempt.profile else ""
                progress(f"[{done}/{total}] {who}{attempt.task} attempt {attempt.index + 1}")
                run_attempt(record, attempt, settings, evals, progress)
        except KeyboardInterrupt:
            record.status = "interrupted"
            evals.put_eval(record)
            raise
        record.status = "finished"
        evals.put_eval(record)
        return record
    finally:
        evals.close()
