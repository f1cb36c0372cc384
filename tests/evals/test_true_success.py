"""A solved attempt is told apart as a true success or a win elsewhere (ISO-Bench's quadrants):
on a task with an injected fault, by whether a solving patch changes a function the fault lives
in; on an open task, by whether its win held when re-measured. Attempts are read from real runs
in a real run store, with the task's own reference and wrong-fix patches as the wins (no
experiment runs here); the SGLang tasks need SGLang's installed package to read."""

from __future__ import annotations

from pathlib import Path

import pytest
from stored_records import stored_experiment, stored_run
from support import needs_sglang_env

from infra_agent.evals.attempt import attempt_result
from infra_agent.evals.metrics import EvalSummary, cell
from infra_agent.evals.records import AttemptRecord, Reverification
from infra_agent.evals.report import rows
from infra_agent.store import RunStore, open_store
from infra_agent.tasks.patch import Patch, load_patch
from infra_agent.tasks.registry import find_task

pytestmark = needs_sglang_env()
INJECTED, OPEN, PLAIN = (
    "sglang-real-label-burst-slowdown",
    "sglang-open-cpu-batch-job",
    "sglang-cpu-tiny",
)


def _solved(store: RunStore, task: str, patch: Patch | None, held: bool | None):  # type: ignore[no-untyped-def]
    """One run whose one experiment is an IMPROVED 1.7x win of `patch`, re-measured (held or
    not) or not re-measured (None)."""
    win = stored_experiment(store, stored_run(store, task, 0), task, 1, 1.7, patch=patch)
    again = None if held is None else Reverification(
        experiment_id="again", of_experiment=win.id, patch_id=win.patch_id, seed=1_000_000,
        verdict="IMPROVED" if held else "NO_CHANGE", speedup=1.7 if held else 1.0,
        disproved=not held,
    )  # fmt: skip
    return attempt_result(store, win.run_id, again)


def _patch(task: str, name: str) -> Patch:
    return load_patch(find_task(task).root / name)


@pytest.mark.parametrize(
    ("task", "patch", "held", "true"),
    [
        (INJECTED, "reference.patch", None, True),  # the PR's fix: the function the fault is in
        (INJECTED, "wrong_fix.patch", None, False),  # a plausible change to another function
        (INJECTED, None, None, False),  # a knob setting that happened to win
        (OPEN, None, True, True),  # held on fresh seeds
        (OPEN, None, None, False),  # never re-measured: not confirmed
        (PLAIN, None, None, None),  # no fault, not open: nothing to tell
    ],
    ids=["at-the-fault", "elsewhere", "knobs-on-a-fault", "open-held", "open-unmeasured", "plain"],
)
def test_a_solved_attempt_is_a_true_success_or_a_win_elsewhere(
    tmp_path: Path, task: str, patch: str | None, held: bool | None, true: bool | None
) -> None:
    store = open_store(tmp_path / "runs.db")
    try:
        result = _solved(store, task, _patch(task, patch) if patch else None, held)
    finally:
        store.close()
    assert result.solved
    assert result.true_success is true


def test_the_eval_table_counts_true_successes_and_wins_elsewhere(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    try:
        results = [
            _solved(store, INJECTED, _patch(INJECTED, "reference.patch"), None),
            _solved(store, INJECTED, _patch(INJECTED, "wrong_fix.patch"), None),
            _solved(store, INJECTED, None, None),
        ]
    finally:
        store.close()
    attempts = [
        AttemptRecord(id=f"a{i}", eval_id="e", task=INJECTED, index=i, status="finished", result=r)
        for i, r in enumerate(results)
    ]
    c = cell("search", "dense", INJECTED, attempts, k=1)
    assert (c.solved, c.true_solved, c.lucky) == (3, 1, 2)
    summary = EvalSummary(eval={"id": "e"}, cells=[c], attempts=[])
    assert rows([summary])[0]["true"] == "1/3"
