"""Run an eval: every task of the suite, K attempts each, one agent run per attempt.

Each attempt is recorded before its run starts and linked to the run as soon as the run exists;
a finished attempt is never run again. On resume (`infra-agent eval --resume EVAL_ID`) an attempt
whose run was interrupted continues that run from its last checkpoint (the agent's own resume),
and one killed before its run's first checkpoint starts a fresh run (the dead one is listed as
abandoned). Attempt k runs with seed k, so attempts differ where the policy is stochastic.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra_agent.agent.configuration import RunConfig
from infra_agent.config import Settings
from infra_agent.errors import UserError
from infra_agent.store import open_store
from infra_agent.store.base import RunStore
from infra_agent.store.evals import AttemptRecord, AttemptResult, EvalRecord, EvalStore, FirstWin

Progress = Callable[[str], None]


def attempt_result(store: RunStore, run_id: str) -> AttemptResult:
    """An attempt's numbers, read from its run's records (steps and experiments)."""
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"run {run_id} is not in the store")
    steps = store.steps(run_id)
    experiments = sorted(store.experiments(run_id), key=lambda e: e.started_at)
    verdicts = [e.result.verdict.value for e in experiments]
    speedups = [
        e.result.evidence.performance.speedup if e.result.evidence.performance else None
        for e in experiments
    ]
    wins = [
        (e, s)
        for e, v, s in zip(experiments, verdicts, speedups, strict=True)
        if v == "IMPROVED" and s is not None
    ]
    assistant = [s for s in steps if s.role == "assistant"]

    def spent(until: Any) -> tuple[int, int, float]:
        mine = [s for s in assistant if until is None or s.created_at <= until]
        tokens = sum((s.prompt_tokens or 0) + (s.completion_tokens or 0) for s in mine)
        return len(mine), tokens, sum(s.cost_usd or 0.0 for s in mine)

    first = None
    if wins:
        win = wins[0][0]
        turns, tokens, cost = spent(win.started_at)
        done = win.started_at.timestamp() + win.duration_s
        first = FirstWin(
            turns=turns,
            experiments=experiments.index(win) + 1,
            tokens=tokens,
            cost_usd=cost,
            wall_s=max(0.0, done - run.created_at.timestamp()),
        )
    turns, tokens, cost = spent(None)
    config = RunConfig.model_validate(run.config)
    return AttemptResult(
        solved=bool(wins),
        best_speedup=max(s for _, s in wins) if wins else None,
        verdicts=verdicts,
        speedups=speedups,
        turns=turns,
        experiments=len(experiments),
        tokens=tokens,
        cost_usd=cost,
        wall_s=(run.updated_at - run.created_at).total_seconds(),
        invalid_calls=sum(1 for s in steps if s.role == "tool" and s.error),
        rejected=verdicts.count("REJECTED"),
        first_win=first,
        tools=config.tools,
        stop_reason=run.summary or None,
    )


def create_eval(
    store_path: Path,
    *,
    suite: str,
    tasks: list[str],
    base: RunConfig,
    attempts: int,
    model: str | None,
) -> EvalRecord:
    """Record a new eval and its pending attempts (nothing runs yet)."""
    if attempts < 1:
        raise UserError("--attempts: at least 1")
    open_store(store_path).close()  # the run store's own schema first
    evals = EvalStore(store_path)
    try:
        record = EvalRecord(
            suite=suite,
            tasks=tasks,
            policy=base.policy,
            model=model,
            feedback=base.feedback,
            attempts=attempts,
            config=base.model_dump(mode="json", exclude={"task", "task_root", "tools"}),
        )
        evals.put_eval(record)
        for task in tasks:
            for k in range(attempts):
                evals.put_attempt(
                    AttemptRecord(
                        id=AttemptRecord.make_id(record.id, task, k),
                        eval_id=record.id,
                        task=task,
                        index=k,
                    )
                )
        return record
    finally:
        evals.close()


def run_eval(
    eval_id: str, settings: Settings, progress: Progress = lambda text: None
) -> EvalRecord:
    """Run (or continue) every unfinished attempt of an eval, in order."""
    from infra_agent.agent.runner import resume_run, start_run

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
        for attempt in todo:
            done += 1
            progress(f"[{done}/{total}] {attempt.task} attempt {attempt.index + 1}")
            config = RunConfig.model_validate(
                {**record.config, "task": attempt.task, "seed": attempt.index}
            )
            try:
                outcome = None
                if attempt.run_id is not None:
                    try:
                        outcome = resume_run(attempt.run_id, settings)
                    except UserError as exc:
                        if "already finished" not in str(exc):
                            attempt.abandoned_runs.append(attempt.run_id)
                            attempt.run_id = None
                if attempt.run_id is None:

                    def on_run(run: Any, attempt: AttemptRecord = attempt) -> None:
                        attempt.run_id, attempt.status = run.id, "running"
                        evals.put_attempt(attempt)

                    outcome = start_run(config, settings, on_run=on_run)
            except KeyboardInterrupt:
                record.status = "interrupted"
                evals.put_eval(record)
                raise
            except UserError as exc:  # the policy cannot work on this task (search: no knobs)
                attempt.status, attempt.reason = "not_applicable", str(exc)
                evals.put_attempt(attempt)
                progress(f"  not applicable: {exc}")
                continue
            except Exception as exc:  # the run failed; its record says why
                attempt.status, attempt.reason = "failed", f"{type(exc).__name__}: {exc}"[:300]
            if attempt.run_id is None:  # failed before its run was recorded
                evals.put_attempt(attempt)
                continue
            run_store = open_store(store_path, readonly=True)
            try:
                attempt.result = attempt_result(run_store, attempt.run_id)
            finally:
                run_store.close()
            if attempt.status != "failed":
                attempt.status = "finished"
                attempt.reason = outcome.stop_reason or "" if outcome is not None else ""
            evals.put_attempt(attempt)
            r = attempt.result
            best = f"{r.best_speedup:.3f}x" if r.best_speedup else "-"
            progress(
                f"  {attempt.status}: solved={r.solved} best={best} "
                f"experiments={r.experiments} turns={r.turns}"
            )
        record.status = "finished"
        evals.put_eval(record)
        return record
    finally:
        evals.close()
