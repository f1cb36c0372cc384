"""One attempt of an eval: its run started (or continued), its numbers read from the run's
records, its best win re-verified, and the attempt recorded after each step.

Used by the sequential loop (`evals.runner`) and by each attempt process (`evals.parallel`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from infra_agent.agent.configuration import RunConfig
from infra_agent.config import Settings
from infra_agent.errors import UserError
from infra_agent.evals.records import (
    AttemptRecord,
    AttemptResult,
    EvalRecord,
    EvalStore,
    FirstWin,
    Reverification,
    SetAside,
    SetAsideReason,
)
from infra_agent.evals.reverify import reverify
from infra_agent.experiments.criteria import success
from infra_agent.judgement import SUSPICIOUS
from infra_agent.store import open_store
from infra_agent.store.base import RunStore
from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import Patch
from infra_agent.tasks.registry import find_task
from infra_agent.tasks.sites import at_fault, has_fault

Progress = Callable[[str], None]


def set_aside(
    experiments: list[ExperimentRecord], reverification: Reverification | None
) -> list[SetAside]:
    """The IMPROVED experiments the eval does not count: flagged suspicious (a person decides),
    or the one re-measured on fresh seeds that did not hold."""
    out = []
    for e in experiments:
        perf = e.result.evidence.performance
        speedup = perf.speedup if perf is not None else None
        if e.result.verdict is not Verdict.IMPROVED:
            continue
        if Flag.SUSPICIOUS in e.result.flags:
            why = [r.removeprefix(SUSPICIOUS) for r in e.result.reasons if r.startswith(SUSPICIOUS)]  # fmt: skip
            out.append(SetAside(experiment_id=e.id, why=SetAsideReason.SUSPICIOUS,
                                speedup=speedup, detail="; ".join(why) or "flagged suspicious"))  # fmt: skip
        elif (again := reverification) is not None and again.of_experiment == e.id and (again.disproved or again.unverified):  # fmt: skip
            seen = f" {again.speedup:.3f}x" if again.speedup is not None else ""
            flags = f" [{', '.join(again.flags)}]" if again.flags else ""
            kind = SetAsideReason.NOT_VERIFIED if again.unverified else SetAsideReason.NOT_HELD
            reason = f": {again.reason}" if again.reason else ""
            out.append(SetAside(experiment_id=e.id, why=kind, speedup=speedup,
                                detail=f"re-measured on fresh seeds: {again.verdict}{flags}{seen}{reason}"))  # fmt: skip
    return out


def true_success(
    store: RunStore,
    task: Task,
    solving: list[ExperimentRecord],
    reverification: Reverification | None,
) -> bool | None:
    """Whether a solved attempt's win is a true success (ISO-Bench's quadrants): on a task with
    a fault (injected, or the engine's own code at declared sites), a solving patch changes a
    function the fault lives in (False: a win found
    elsewhere); on an open task, its best win held when re-measured on fresh seeds (False: not
    re-measured). None: not solved, or a task with neither."""
    if not solving:
        return None
    if task.manifest.open is not None:
        again = reverification
        return again is not None and not (again.disproved or again.unverified)
    if not has_fault(task):
        return None
    patches = [store.get_patch(e.patch_id) for e in solving]
    return any(at_fault(task, Patch.from_record(p)) for p in patches if p is not None)


def attempt_result(
    store: RunStore, run_id: str, reverification: Reverification | None = None
) -> AttemptResult:
    """An attempt's numbers, read from its run's records (steps and experiments), with its best
    win's re-measurement when there is one."""
    run = store.get_run(run_id)
    if run is None:
        raise UserError(f"run {run_id} is not in the store")
    steps = store.steps(run_id)
    experiments = sorted(store.experiments(run_id), key=lambda e: e.started_at)
    config = RunConfig.model_validate(run.config)
    task = find_task(config.task_root or config.task)
    manifest = task.manifest
    aside = set_aside(experiments, reverification)
    ignored = {a.experiment_id for a in aside}
    met = [success(manifest, e.result) for e in experiments]
    verdicts = [e.result.verdict.value for e in experiments]
    speedups = [
        e.result.evidence.performance.speedup if e.result.evidence.performance else None
        for e in experiments
    ]
    wins = [
        (e, s)
        for e, v, s in zip(experiments, verdicts, speedups, strict=True)
        if v == "IMPROVED" and s is not None and e.id not in ignored
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
    best = max(s for _, s in wins) if wins else None
    solving = [e for e, m in zip(experiments, met, strict=True) if m and e.id not in ignored]
    known = manifest.open.best_known if manifest.open is not None else None
    return AttemptResult(
        solved=bool(solving),
        improved="IMPROVED" in verdicts,
        best_speedup=best,
        set_aside=aside,
        beats_best_known=None if known is None else best is not None and best > known,
        true_success=true_success(store, task, solving, reverification),
        reverification=reverification,
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


def _read_result(store_path: Path, run_id: str, again: Reverification | None) -> AttemptResult:
    run_store = open_store(store_path, readonly=True)
    try:
        return attempt_result(run_store, run_id, again)
    finally:
        run_store.close()


def with_profile(settings: Settings, profile: str | None) -> Settings:
    """`settings` with the LLM profile an attempt runs with (unchanged for None)."""
    if profile is None:
        return settings
    if profile not in settings.llm.profiles:
        known = ", ".join(sorted(settings.llm.profiles)) or "none"
        raise UserError(f"--model: no LLM profile '{profile}' (profiles: {known})")
    llm = settings.llm.model_copy(update={"profile": profile})
    return settings.model_copy(update={"llm": llm})


def attempt_config(
    record: EvalRecord, attempt: AttemptRecord, search_path: Iterable[Path] = ()
) -> RunConfig:
    """The attempt's run: the eval's settings on the attempt's task and seed, working toward
    that task's own objective (an accuracy task's run is not told to raise throughput). A task
    named by name is looked up in `search_path` too (`settings.tasks.search_path`)."""
    objective = find_task(attempt.task, search_path).manifest.objective
    return RunConfig.model_validate(
        {**record.config, "task": attempt.task, "seed": attempt.index, "objective": objective}
    )


def run_attempt(
    record: EvalRecord,
    attempt: AttemptRecord,
    settings: Settings,
    evals: EvalStore,
    progress: Progress,
    on_state: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Run (or continue) one attempt's run, read its result, re-verify its best win, and record
    the attempt after each step. A failed run is recorded; KeyboardInterrupt goes up.
    `on_state` sees the graph's state after each step (a Ray node sends finished experiments
    to its driver from there)."""
    from infra_agent.agent.runner import resume_run, start_run

    store_path = settings.store.path()
    config = attempt_config(record, attempt, settings.tasks.search_path)
    mine = with_profile(settings, attempt.profile)
    try:
        outcome = None
        if attempt.run_id is not None:
            try:
                outcome = resume_run(attempt.run_id, mine, on_state=on_state)
            except UserError as exc:
                if "already finished" not in str(exc):
                    attempt.abandoned_runs.append(attempt.run_id)
                    attempt.run_id = None
        if attempt.run_id is None:

            def on_run(run: Any) -> None:
                attempt.run_id, attempt.status = run.id, "running"
                evals.put_attempt(attempt)

            outcome = start_run(config, mine, on_run=on_run, on_state=on_state)
    except UserError as exc:  # the policy cannot work on this task (search: no knobs)
        attempt.status, attempt.reason = "not_applicable", str(exc)
        evals.put_attempt(attempt)
        progress(f"  not applicable: {exc}")
        return
    except Exception as exc:  # the run failed; its record says why
        attempt.status, attempt.reason = "failed", f"{type(exc).__name__}: {exc}"[:300]
    if attempt.run_id is None:  # failed before its run was recorded
        evals.put_attempt(attempt)
        return
    attempt.result = _read_result(store_path, attempt.run_id, None)
    note = ""
    if record.reverify and attempt.status != "failed" and attempt.result.best_speedup is not None:
        progress("  re-verifying the best win on fresh seeds")
        try:
            again = reverify(store_path, attempt.run_id)
        except Exception as exc:  # recorded; the attempt's own numbers stand
            note = f"re-verification failed: {type(exc).__name__}: {exc}"[:300]
        else:  # a win that does not hold is set aside
            attempt.result = _read_result(store_path, attempt.run_id, again)
    if attempt.status != "failed":
        attempt.status = "finished"
        stopped = outcome.stop_reason or "" if outcome is not None else ""
        attempt.reason = "; ".join(r for r in (stopped, note) if r)
    evals.put_attempt(attempt)
    r = attempt.result
    best = f"{r.best_speedup:.3f}x" if r.best_speedup else "-"
    again = r.reverification
    checked = f" re-verified={again.verdict}" if again else ""
    if again is not None and again.reason:
        checked += f" ({again.reason[:160]})"
    aside = f" set_aside={len(r.set_aside)}" if r.set_aside else ""
    beat = " beats the best known result" if r.beats_best_known else ""
    # Not a true success: on an open task (it has a best known result), a win not re-measured.
    lucky = "not re-measured" if r.beats_best_known is not None else "a win elsewhere"
    beat += {True: " (true success)", False: f" ({lucky})", None: ""}[r.true_success]
    progress(
        f"  {attempt.status}: solved={r.solved} improved={r.improved} best={best}"
        f"{checked}{aside}{beat} experiments={r.experiments} turns={r.turns}"
    )
