"""An open task's attempt records whether its best win beats the best result the task states as
known (`[open] best_known`), counting only a win that held when re-measured; other tasks record
nothing. Attempts are read from real runs in a real run store (no experiments are run here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from stored_records import stored_experiment, stored_run

from infra_agent.evals.attempt import attempt_result
from infra_agent.evals.records import Reverification
from infra_agent.store import RunStore, open_store
from infra_agent.tasks.registry import find_task

OPEN, CLOSED = "sglang-open-cpu-batch-job", "sglang-cpu-tiny"


def _attempt(store: RunStore, task: str, speedup: float, held: bool):  # type: ignore[no-untyped-def]
    """One run with one IMPROVED experiment of `speedup`, re-measured as `held` or not."""
    win = stored_experiment(store, stored_run(store, task, 0), task, 1, speedup)
    again = Reverification(
        experiment_id="again", of_experiment=win.id, patch_id=win.patch_id, seed=1_000_000,
        verdict="IMPROVED" if held else "NO_CHANGE", speedup=speedup if held else 1.0,
        disproved=not held,
    )  # fmt: skip
    return attempt_result(store, win.run_id, again)


@pytest.mark.parametrize(
    ("task", "above", "held", "beats"),
    [
        (OPEN, 0.3, True, True),
        (OPEN, -0.05, True, False),
        (OPEN, 0.3, False, False),  # a win that did not hold is no record
        (CLOSED, 0.3, True, None),
    ],
    ids=["open-beats", "open-below", "open-not-held", "not-open"],
)
def test_beating_the_best_known_is_recorded(
    tmp_path: Path, task: str, above: float, held: bool, beats: bool | None
) -> None:
    goal = find_task(OPEN).manifest.open
    assert goal is not None
    store = open_store(tmp_path / "runs.db")
    try:
        result = _attempt(store, task, goal.best_known + above, held)
    finally:
        store.close()
    assert result.beats_best_known is beats
    assert result.solved is (held and task == OPEN or task == CLOSED)
