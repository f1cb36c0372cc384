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
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra_agent.agent.configuration import RunConfig
from infra_agent.config import Settings
from infra_agent.errors import UserError
from infra_agent.evals.records import AttemptRecord, AttemptResult, EvalRecord, EvalStore, FirstWin
from infra_agent.evals.reverify import reverify
from infra_agent.experiments.criteria import success
from infra_agent.store import open_store
from infra_agent.store.base import RunStore
from infra_agent.tasks.registry import find_task

Progress = Callable[[str], None]


def attempt_result(store: RunStore, run_id: str) -> AttemptResult:
    """An attempt's numbers, read from its run's records (steps and experiments)."""
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"run {run_id} is not in the store")
    steps = store.steps(run_id)
    experiments = sorted(store.experiments(run_id), key=lambda e: e.started_at)
    config = RunConfig.model_validate(run.config)
    manifest = find_task(config.task_root or config.task).manifest
    met = [success(manifest, e.result) for e in experiments]
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
    return AttemptResult(
        solved=any(met),
        improved=bool(wins),
        best_speedup=max(s for _, s in wins) if wins else None,
        criteria_met=met,
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


def with_profile(settings: Settings, profile: str | None) -> Settings:
    """`settings` with the LLM profile an attempt runs with (unchanged for None)."""
    if profile is None:
        return settings
    if profile not in settings.llm.profiles:
        known = ", ".join(sorted(settings.llm.profiles)) or "none"
        raise UserError(f"--model: no LLM profile '{profile}' (profiles: {known})")
    llm = settings.llm.model_copy(update={"profile": profile})
    return settings.model_copy(update={"llm": llm})


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
            who = f"{attempt.profile}: " if attempt.profile else ""
            progress(f"[{done}/{total}] {who}{attempt.task} attempt {attempt.index + 1}")
            config = RunConfig.model_validate(
                {**record.config, "task": attempt.task, "seed": attempt.index}
            )
            mine = with_profile(settings, attempt.profile)
            try:
                outcome = None
                if attempt.run_id is not None:
                    try:
                        outcome = resume_run(attempt.run_id, mine)
                    except UserError as exc:
                        if "already finished" not in str(exc):
                            attempt.abandoned_runs.append(attempt.run_id)
                            attempt.run_id = None
                if attempt.run_id is None:

                    def on_run(run: Any, attempt: AttemptRecord = attempt) -> None:
                        attempt.run_id, attempt.status = run.id, "running"
                        evals.put_attempt(attempt)

                    outcome = start_run(config, mine, on_run=on_run)
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
            note = ""
            if record.reverify and attempt.status != "failed" and attempt.result.improved:
                progress("  re-verifying the best win on fresh seeds")
                try:
                    attempt.result.reverification = reverify(store_path, attempt.run_id)
                except KeyboardInterrupt:
                    record.status = "interrupted"
                    evals.put_eval(record)
                    raise
                except Exception as exc:  # recorded; the attempt's own numbers stand
                    note = f"re-verification failed: {type(exc).__name__}: {exc}"[:300]
            if attempt.status != "failed":
                attempt.status = "finished"
                stopped = outcome.stop_reason or "" if outcome is not None else ""
                attempt.reason = "; ".join(r for r in (stopped, note) if r)
            evals.put_attempt(attempt)
            r = attempt.result
            best = f"{r.best_speedup:.3f}x" if r.best_speedup else "-"
            again = r.reverification
            checked = f" re-verified={again.verdict}" if again else ""
            progress(
                f"  {attempt.status}: solved={r.solved} improved={r.improved} best={best}"
                f"{checked} experiments={r.experiments} turns={r.turns}"
            )
        record.status = "finished"
        evals.put_eval(record)
        return record
    finally:
        evals.close()
