"""An open task's attempt records whether its best win beats the best result the task states as
known (`[open] best_known`), counting only a win that held when re-measured; other tasks record
nothing. Attempts are read from real runs in a real run store (no experiments are run here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from infra_agent.evals.attempt import attempt_result
from infra_agent.evals.records import Reverification
from infra_agent.store import RunStore, open_store
from infra_agent.store.records import ExperimentRecord, RunRecord
from infra_agent.store.verdict import Evidence, ExperimentResult, PerformanceEvidence, Verdict
from infra_agent.tasks.patch import knob_patch
from infra_agent.tasks.registry import find_task

OPEN, CLOSED = "sglang-open-cpu-batch-job", "sglang-cpu-tiny"
T0 = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


def _attempt(store: RunStore, task: str, speedup: float, held: bool):  # type: ignore[no-untyped-def]
    """One run with one IMPROVED experiment of `speedup`, re-measured as `held` or not."""
    run = RunRecord(task=task, objective="throughput", policy="scripted",
                    config={"task": task, "seed": 0}, created_at=T0)  # fmt: skip
    store.put_run(run)
    patch = knob_patch({"max-running-requests": 8}).to_record()
    store.put_patch(patch)
    perf = PerformanceEvidence(
        metric="output_throughput", unit="tok/s", higher_is_better=True, baseline_median=1000.0,
        candidate_median=1000.0 * speedup, speedup=speedup, ci_low=speedup * 0.95,
        ci_high=speedup * 1.05, n_samples=8,
    )  # fmt: skip
    met = {"ttft_p99_ms_ratio": 0.9, "ttft_p99_ms_ratio_low": 0.8, "ttft_p99_ms_ratio_high": 1.0}
    result = ExperimentResult(
        task=task, patch_id=patch.id, verdict=Verdict.IMPROVED, reasons=["better"],
        evidence=Evidence(stage_reached="health", performance=perf, metrics=met),
    )  # fmt: skip
    win = ExperimentRecord(
        run_id=run.id, task=task, patch_id=patch.id, sandbox="local", result=result,
        started_at=T0 + timedelta(minutes=1), duration_s=60.0, target_fingerprint="fp",
    )  # fmt: skip
    store.put_experiment(win)
    again = Reverification(
        experiment_id="again", of_experiment=win.id, patch_id=patch.id, seed=1_000_000,
        verdict="IMPROVED" if held else "NO_CHANGE", speedup=speedup if held else 1.0,
        disproved=not held,
    )  # fmt: skip
    return attempt_result(store, run.id, again)


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
