"""A run store of random experiments, proposals and decisions, for the export tests that need
many shapes of runs (imported by name: conftest.py puts this folder on the path)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from infra_agent.store import open_store
from infra_agent.store.records import RunRecord, StepRecord


def random_rewards_store(
    db: Path, seed: int, *, gone: float = 0.2, orphans: bool = True, runs: int = 40
) -> None:
    """Runs with random experiments (every verdict, flags, with or without performance and
    correctness evidence, CI lows at and below zero), patches shared by several experiments,
    proposals backed by some of them (or by an experiment recorded without the run id), and
    decisions on the proposal's patch or another. `gone`: the chance that a proposal also names
    an experiment the store does not hold; `orphans`: whether some experiments are recorded
    without their run id."""
    import random

    from infra_agent.store.records import (
        DecisionAction,
        DecisionRecord,
        ExperimentRecord,
        ProposalRecord,
        ProposalStatus,
    )
    from infra_agent.store.verdict import (
        CorrectnessEvidence,
        Evidence,
        ExperimentResult,
        Flag,
        PerformanceEvidence,
        Verdict,
    )

    rng = random.Random(seed)
    store = open_store(db)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for r in range(runs):
        run = RunRecord(task=f"t{r % 3}", objective="latency", policy="llm",
                        created_at=t0 + timedelta(minutes=r))  # fmt: skip
        store.put_run(run)
        store.add_step(StepRecord(run_id=run.id, role="user", content="go"))
        store.add_step(StepRecord(run_id=run.id, role="assistant", content="ok",
                                  cost_usd=rng.choice([None, 0.1, 0.2, 1e-7])))  # fmt: skip
        patches = [f"{r:04d}{k:060d}" for k in range(3)]
        ids = []
        for k in range(rng.choice([0, 1, 2, 3, 5])):
            perf = None
            if rng.random() < 0.7:
                lo = rng.choice([-0.2, 0.0, 0.9, 1.0, 1.3, 2.0, 3.7, rng.uniform(0.5, 4)])
                perf = PerformanceEvidence(metric="ms", unit="ms", higher_is_better=False,
                                           baseline_median=1, candidate_median=1,
                                           speedup=rng.choice([2.5, 4.0, lo + rng.random()]), ci_low=lo,
                                           ci_high=lo + 1, n_samples=3)  # fmt: skip
            corr = None
            if rng.random() < 0.6:
                corr = CorrectnessEvidence(
                    passed=rng.random() < 0.7,
                    baseline_err_f64=rng.choice([None, 0.0, 1e-3, rng.random()]),
                    candidate_err_f64=rng.choice([None, 0.0, -1e-9, 1e-5, rng.random()]),
                )
            flags = [f for f in (Flag.SUSPICIOUS, Flag.HEALTH_WARNING, Flag.NOISY)
                     if rng.random() < 0.25]  # fmt: skip
            patch = rng.choice(patches)
            result = ExperimentResult(task=run.task, patch_id=patch, verdict=rng.choice([Verdict.IMPROVED] * 3 + list(Verdict)),
                                      reasons=["x"], flags=flags,
                                      evidence=Evidence(performance=perf, correctness=corr))  # fmt: skip
            exp = ExperimentRecord(run_id=run.id if k or r % 7 or not orphans else None, task=run.task,
                                   patch_id=patch, result=result,
                                   started_at=t0 + timedelta(seconds=k))  # fmt: skip
            store.put_experiment(exp)
            ids.append(exp.id)
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            backing = rng.sample(ids, k=min(len(ids), rng.choice([0, 1, 2])))
            prop = ProposalRecord(run_id=run.id, task=run.task, patch_id=rng.choice(patches),
                                  patch_hash=rng.choice(patches),
                                  experiment_ids=[*backing, *(["exp-gone"] if rng.random() < gone else [])],
                                  status=rng.choice(list(ProposalStatus)))  # fmt: skip
            store.put_proposal(prop)
            for _ in range(rng.choice([0, 1, 2])):
                store.add_decision(DecisionRecord(
                    proposal_id=prop.id, reviewer="r", action=rng.choice(list(DecisionAction)),
                    patch_hash=rng.choice([prop.patch_hash, "other"])))  # fmt: skip
    store.close()
