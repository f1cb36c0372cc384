"""Eval metrics per (policy or model) x feedback x task, and across tasks.

solved: the share of attempts that met the task's own success criterion (a correct, IMPROVED
patch with every target and constraint the task declares shown met; IMPROVED alone where it
declares none) with a win not set aside; of those, true: at the injected fault (or on an open
task, held when re-measured), lucky: elsewhere (ISO-Bench's quadrants); improved: the share with any IMPROVED patch; set aside:
wins that count neither as solved nor in fast_p, by reason (flagged suspicious: a person decides;
not held: not IMPROVED again when re-measured); pass@k: the unbiased estimator over n attempts
with c solved (1 - C(n-c, k) / C(n, k)); fast_p: the share of attempts whose best IMPROVED ratio
not set aside exceeds p (KernelBench's fast_p, correct and faster than p, p in 1.0, 1.2, 1.5,
2.0); to the first win: medians over the attempts with a win not set aside; disproved: attempts
whose best win was not IMPROVED again when re-measured on fresh seeds. Intervals are Wilson 95%
intervals for shares over attempts (both from the judgement core, `judgement.intervals`).
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.evals.records import AttemptRecord, EvalRecord, SetAsideReason
from infra_agent.judgement.intervals import pass_at_k, wilson

FAST_P = (1.0, 1.2, 1.5, 2.0)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


class Cell(BaseModel):
    """One (agent, feedback, task) cell, or a whole suite when task is '*'."""

    agent: str
    """The policy, or the model for the llm policy."""
    feedback: str
    task: str
    attempts: int
    not_applicable: int = 0
    applicable: int = 0
    """Attempts the policy could work on: the shares and intervals are over these (a search
    policy on a task without knobs is not applicable, not a failure to solve)."""
    failed: int = 0
    solved: int
    """Attempts that met the task's own success criterion."""
    solve_rate: float
    solve_ci: tuple[float, float]
    true_solved: int = 0
    """Solved attempts that are true successes: at the injected fault, or on an open task a win
    that held when re-measured (`AttemptResult.true_success`)."""
    lucky: int = 0
    """Solved attempts that are not: a win elsewhere than the fault, or an open task's win not
    re-measured. Solved attempts of tasks with neither are in neither count."""
    improved: int = 0
    """Attempts with an IMPROVED patch (more than `solved` where targets were missed or wins
    were set aside)."""
    set_aside: dict[str, int] = Field(default_factory=dict)
    """Wins not counted (neither solved nor in fast_p), by reason: 'suspicious', 'not held'."""
    reverified: int = 0
    """Attempts whose best win was re-measured on fresh seeds."""
    disproved: int = 0
    """Of those, the wins that were not IMPROVED again (claims disproved)."""
    best_speedup: float | None = None
    speedups: list[float] = Field(default_factory=list)
    """Each attempt's best IMPROVED ratio (attempts with an IMPROVED patch only)."""
    fast_p: dict[str, float] = Field(default_factory=dict)
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    first_win: dict[str, float | None] = Field(default_factory=dict)
    """Medians to the first win: turns, experiments, tokens, cost_usd, wall_s."""
    invalid_calls: int = 0
    rejected: int = 0
    tools: list[str] = Field(default_factory=list)


def agent_label(record: EvalRecord, profile: str | None = None) -> str:
    """The policy, with the LLM profile (several in one eval) or the model it ran."""
    model = profile or record.model
    return f"{record.policy}:{model}" if model else record.policy


def cell(agent: str, feedback: str, task: str, attempts: list[AttemptRecord], k: int) -> Cell:
    results = [a.result for a in attempts if a.result is not None]
    not_applicable = sum(1 for a in attempts if a.status == "not_applicable")
    n = len(attempts) - not_applicable
    best = [r.best_speedup for r in results if r.best_speedup is not None]  # IMPROVED ones
    solved = sum(1 for r in results if r.solved)
    again = [r.reverification for r in results if r.reverification is not None]
    wins = [r.first_win for r in results if r.first_win is not None]
    tools = sorted({t for r in results for t in r.tools})
    aside = Counter(a.why for r in results for a in r.set_aside)
    return Cell(
        agent=agent,
        feedback=feedback,
        task=task,
        attempts=len(attempts),
        not_applicable=not_applicable,
        applicable=n,
        failed=sum(1 for a in attempts if a.status == "failed"),
        solved=solved,
        solve_rate=solved / n if n else 0.0,
        solve_ci=wilson(solved, n),
        true_solved=sum(1 for r in results if r.true_success is True),
        lucky=sum(1 for r in results if r.true_success is False),
        improved=sum(1 for r in results if (r.solved if r.improved is None else r.improved)),
        set_aside={w.value: aside[w] for w in SetAsideReason if aside[w]},
        reverified=len(again),
        disproved=sum(1 for r in again if r.disproved),
        best_speedup=max(best) if best else None,
        speedups=best,
        fast_p={f"{p:g}": (sum(1 for b in best if b > p) / n if n else 0.0) for p in FAST_P},
        pass_at_k={str(j): pass_at_k(n, solved, j) for j in range(1, k + 1) if j <= n},
        first_win={
            field: _median([float(getattr(w, field)) for w in wins])
            for field in ("turns", "experiments", "tokens", "cost_usd", "wall_s")
        },
        invalid_calls=sum(r.invalid_calls for r in results),
        rejected=sum(r.rejected for r in results),
        tools=tools,
    )


class EvalSummary(BaseModel):
    """What `infra-agent eval report --json` prints."""

    eval: dict[str, Any]
    cells: list[Cell]
    """Per agent: per task, then one '*' row for the whole suite."""
    attempts: list[dict[str, Any]]


def summarize(record: EvalRecord, attempts: list[AttemptRecord]) -> EvalSummary:
    """Per agent (one, or one per LLM profile), its tasks and then its '*' suite row."""
    cells: list[Cell] = []
    profiles: list[str | None] = [*record.profiles] or [None]
    for profile in profiles:
        agent = agent_label(record, profile)
        mine = [a for a in attempts if a.profile == profile]
        per_task = [
            cell(agent, record.feedback, task, [a for a in mine if a.task == task], record.attempts)
            for task in record.tasks
        ]
        suite = cell(agent, record.feedback, "*", mine, record.attempts)
        counted = [c for c in per_task if c.applicable]
        if counted:  # pass@k of a suite: the mean over its applicable tasks (each its own n)
            suite.pass_at_k = {
                j: statistics.fmean(c.pass_at_k.get(j, 0.0) for c in counted)
                for j in suite.pass_at_k
            }
        cells += [*per_task, suite]
    return EvalSummary(
        eval=record.model_dump(mode="json"),
        cells=cells,
        attempts=[a.model_dump(mode="json") for a in attempts],
    )
