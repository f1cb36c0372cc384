"""Runs and IMPROVED-style experiments written straight into a real run store, for the eval tests
that read attempts back (`evals.attempt.attempt_result`) without running any experiment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from infra_agent.store import RunStore
from infra_agent.store.records import ExperimentRecord, RunRecord
from infra_agent.store.verdict import Evidence, ExperimentResult, Flag, PerformanceEvidence, Verdict
from infra_agent.tasks.patch import Patch, knob_patch

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def stored_run(store: RunStore, task: str, seed: int) -> str:
    """A scripted throughput run of `task` created at T0; its id."""
    run = RunRecord(task=task, objective="throughput", policy="scripted",
                    config={"task": task, "seed": seed}, created_at=T0)  # fmt: skip
    store.put_run(run)
    return run.id


def stored_experiment(
    store: RunStore, run_id: str, task: str, n: int, speedup: float, *,
    flags: list[Flag] | None = None, reasons: list[str] | None = None,
    verdict: Verdict = Verdict.IMPROVED, patch: Patch | None = None,
) -> ExperimentRecord:  # fmt: skip
    """Experiment `n` of the run (`patch`, or a knob patch of its own; started n minutes after
    T0): output throughput `speedup`x with an interval of +-5%, its TTFT constraint shown met."""
    patch = (patch or knob_patch({"max-running-requests": 4 + n})).to_record()
    store.put_patch(patch)
    perf = PerformanceEvidence(
        metric="output_throughput", unit="tok/s", higher_is_better=True, baseline_median=300.0,
        candidate_median=300.0 * speedup, speedup=speedup, ci_low=speedup * 0.95,
        ci_high=speedup * 1.05, n_samples=8,
    )  # fmt: skip
    met = {"ttft_p99_ms_ratio": 0.9, "ttft_p99_ms_ratio_low": 0.8, "ttft_p99_ms_ratio_high": 1.0}
    result = ExperimentResult(
        task=task, patch_id=patch.id, verdict=verdict, flags=flags or [],
        reasons=[f"better with confidence: speedup {speedup:.3f}x", *(reasons or [])],
        evidence=Evidence(stage_reached="health", performance=perf, metrics=met),
    )  # fmt: skip
    record = ExperimentRecord(
        run_id=run_id, task=task, patch_id=patch.id, sandbox="local", result=result,
        started_at=T0 + timedelta(minutes=n), duration_s=60.0, target_fingerprint="fp",
    )  # fmt: skip
    store.put_experiment(record)
    return record
