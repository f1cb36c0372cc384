"""`infra-agent tasks check TASK`: does a task do what its author says, measured?

For a task author (bundled or a user's folder), three questions, each answered by running it:

- **symptom**: with an injected fault (`inject.patch`), an experiment whose candidate is the
  un-injected engine (`tasks.tree.uninjected_patch`): the symptom is reproduced when that
  candidate is IMPROVED over the faulty baseline, and its ratio is the symptom's size. Without an
  injected fault, the harness's `diagnose` (reproduce, then localize); a task with neither has
  no symptom to check, and an open task (`[open]`: the unmodified engine, a gain to reach) has
  none by design.
- **reference**: an experiment with `reference.patch`; it must be IMPROVED (on an open task,
  its number is set beside the best known gain and the task's target).
- **wrong fix**: an experiment with `wrong_fix.patch`; it must not be IMPROVED.
- **baseline**: the faulty baseline is measured afresh in each experiment; how far its medians
  lie apart (largest over smallest) must be less than the symptom (or, with no symptom
  experiment, the reference's gain): a task whose baseline swings as much as its fault cannot
  score an agent.

    check = check_task(task, params={}, sandbox="local")   # TaskCheck, rows in that order
    check.passed, check.render()
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.store.verdict import Verdict
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import Patch, load_patch

Progress = Callable[[str], None]


class CheckRow(BaseModel):
    """One question of the check and its measured answer."""

    question: str
    """'symptom', 'reference' or 'wrong fix'."""
    expected: str
    """What a working task gives, e.g. 'IMPROVED'."""
    verdict: str | None = None
    """The experiment's verdict (or 'REPRODUCED' / 'NOT REPRODUCED' from a diagnosis)."""
    ok: bool | None = None
    """Whether the answer is what a working task gives (None: not applicable)."""
    number: str = ""
    """The decisive number: the ratio with its 95% interval, or the diagnosis's symptom."""
    reasons: list[str] = Field(default_factory=list)
    experiment_id: str | None = None
    duration_s: float = 0.0
    baseline_median: float | None = None
    """The faulty baseline's median in this experiment (None: no performance measured)."""
    gain: float | None = None
    """The experiment's gain, oriented so that > 1 is better."""
    unit: str = ""


class TaskCheck(BaseModel):
    """What `tasks check --json` prints."""

    task: str
    objective: str
    metric: str
    rows: list[CheckRow]
    duration_s: float

    @property
    def passed(self) -> bool:
        return all(row.ok is not False for row in self.rows)

    def render(self) -> str:
        lines = [f"{self.task}: {'OK' if self.passed else 'PROBLEM'} ({self.duration_s:.0f} s)"]
        for row in self.rows:
            mark = {True: "ok", False: "FAIL", None: "n/a"}[row.ok]
            lines.append(
                f"- {row.question}: {row.verdict or '-'} (want {row.expected}) {mark}"
                f"{'; ' + row.number if row.number else ''}"
                + (f" [{row.duration_s:.0f} s]" if row.duration_s else "")
            )
            lines.extend(f"    {reason}" for reason in row.reasons[:2])
        return "\n".join(lines)


def _ratio(record: Any) -> str:
    perf = record.result.evidence.performance
    if perf is None:
        return ""
    return (
        f"{perf.metric} {perf.speedup:.3g}x (95% CI {perf.ci_low:.3g}-{perf.ci_high:.3g}); "
        f"medians {perf.baseline_median:.4g} -> {perf.candidate_median:.4g} {perf.unit}"
    )


def _experiment(
    task: Task, question: str, patch: Patch, want_improved: bool, run: Callable[..., Any]
) -> CheckRow:
    started = time.monotonic()
    record = run(task, patch)
    verdict = record.result.verdict
    improved = verdict == Verdict.IMPROVED
    perf = record.result.evidence.performance
    return CheckRow(
        question=question,
        expected="IMPROVED" if want_improved else "not IMPROVED",
        verdict=verdict.value,
        ok=improved if want_improved else not improved,
        number=_ratio(record),
        reasons=list(record.result.reasons),
        experiment_id=record.id,
        duration_s=round(time.monotonic() - started, 1),
        baseline_median=perf.baseline_median if perf else None,
        gain=perf.speedup if perf else None,
        unit=perf.unit if perf else "",
    )


def _baseline(rows: list[CheckRow]) -> CheckRow:
    """How steady the faulty baseline was across the check's experiments, against the effect the
    task must show (the symptom's gain, or the reference's where no experiment measured one)."""
    row = CheckRow(question="baseline", expected="steadier than the symptom")
    medians = [r.baseline_median for r in rows if r.baseline_median is not None]
    unit = next((r.unit for r in rows if r.baseline_median is not None), "")
    if len(medians) < 2:
        row.number = f"{len(medians)} experiment(s) measured the baseline: no spread to state"
        return row
    listed = ", ".join(f"{m:.4g}" for m in medians)
    if min(medians) <= 0:
        row.number = f"medians {listed} {unit}: a median at or below 0, no ratio to state"
        return row
    spread = max(medians) / min(medians)
    effect = next((r for r in rows if r.gain is not None and r.question != "wrong fix"), None)
    row.number = f"medians {listed} {unit} over {len(medians)} experiments: within {spread:.3g}x"
    if effect is None or effect.gain is None:
        return row
    row.ok = spread < effect.gain
    row.verdict = "STEADY" if row.ok else "UNSTEADY"
    row.number += f", against the {effect.question}'s {effect.gain:.3g}x"
    return row


def _diagnosed_symptom(
    task: Task, params: dict[str, Any] | None, sandbox: str, say: Progress
) -> CheckRow:
    """A task with no injected fault: its symptom is what `diagnose` reproduces, if it can."""
    from infra_agent.experiments.arms import effective_params, load_harness
    from infra_agent.experiments.diagnose import run_diagnosis

    harness = load_harness(task, effective_params(task.manifest, params))
    if not callable(getattr(harness, "diagnose", None)):
        return CheckRow(question="symptom", expected="a symptom", number="no injected "
                        "fault and no diagnose in the harness")  # fmt: skip
    say("symptom: diagnose (reproduce, then localize)")
    t0 = time.monotonic()
    diagnosis = run_diagnosis(str(task.root), params, sandbox=sandbox)
    return CheckRow(
        question="symptom",
        expected="REPRODUCED",
        verdict="REPRODUCED" if diagnosis.reproduced else "NOT REPRODUCED",
        ok=diagnosis.reproduced,
        number=diagnosis.symptom,
        duration_s=round(time.monotonic() - t0, 1),
    )


def check_task(
    task: Task,
    *,
    params: dict[str, Any] | None = None,
    sandbox: str = "local",
    store: Any = None,
    progress: Progress | None = None,
) -> TaskCheck:
    """Measure the task's symptom, its reference fix and its wrong fix (see the module doc)."""
    from infra_agent.experiments.run import run_experiment
    from infra_agent.tasks.tree import uninjected_patch

    say = progress or (lambda _msg: None)
    started = time.monotonic()

    def run(task: Task, patch: Patch) -> Any:
        return run_experiment(
            task,
            patch,
            sandbox=sandbox,
            params=params,
            store=store,
            progress=lambda stage: say(f"{current}: {stage}"),
        )

    rows: list[CheckRow] = []
    current = "symptom"
    goal = task.manifest.open
    if goal is not None:
        rows.append(CheckRow(question="symptom", expected="none (open task)", number="open task: "
                             "the unmodified engine, no planted fault"))  # fmt: skip
    elif (clean := uninjected_patch(task)) is not None:
        say("symptom: the un-injected engine against the faulty baseline")
        rows.append(_experiment(task, "symptom", clean, True, run))
    else:
        rows.append(_diagnosed_symptom(task, params, sandbox, say))
    for question, path, want in (
        ("reference", task.reference_patch, True),
        ("wrong fix", task.wrong_fix_patch, False),
    ):
        current = question
        if path is None:
            rows.append(CheckRow(question=question, expected="IMPROVED" if want else
                                 "not IMPROVED", number=f"no {question} patch"))  # fmt: skip
            continue
        say(f"{question}: {path.name}")
        row = _experiment(task, question, load_patch(path, author="tasks check"), want, run)
        if goal is not None and question == "reference":
            row.number += (
                f"; target {task.manifest.gain_target:g}x, best known {goal.best_known:g}x "
                f"({goal.best_known_by})"
            )
        rows.append(row)
    rows.append(_baseline(rows))
    return TaskCheck(
        task=task.name,
        objective=task.manifest.objective,
        metric=task.manifest.metric.name,
        rows=rows,
        duration_s=round(time.monotonic() - started, 1),
    )
