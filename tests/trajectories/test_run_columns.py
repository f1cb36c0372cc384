"""`run_columns.RunColumns` (rewards, best candidates, verdicts, proposals, column-wise) gives the
rows of `rows.run_row` for in-memory runs built to hit its corners: ties between candidates,
NaN and infinite speedups, candidates without a speedup, suspicious wins, patches tried twice,
an experiment shared by two runs, proposals backed by none of the run's experiments, reviews by
the policy only. Compared as Parquet bytes (NaN is not equal to itself in `Table.equals`)."""

from __future__ import annotations

import io
import math
import random
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra_agent.experiments.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    ProposalRecord,
    ProposalStatus,
    RunRecord,
    StepRecord,
)
from infra_agent.trajectories.build import RunBundle
from infra_agent.trajectories.chat_columns import ChatColumns
from infra_agent.trajectories.formats import ExportFormat
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.rows import run_row
from infra_agent.trajectories.run_columns import RunColumns
from infra_agent.trajectories.writers import arrow_table

SPEEDUPS = [1.5, 2.5, 2.5, 4.0, math.nan, math.inf, 0.0, 3]  # repeats and an int: ties
LOWS = [0.9, 1.2, 2.0, 2.0, 4.0, math.nan, math.inf, 0.0, -1.0]  # >= 2 all score 1: ties


def _experiment(rng: random.Random, run_id: str, patches: list[str]) -> ExperimentRecord:
    perf = None
    if rng.random() < 0.8:
        perf = PerformanceEvidence(metric="ms", unit="ms", higher_is_better=False,
                                   baseline_median=1, candidate_median=1,
                                   speedup=rng.choice(SPEEDUPS), ci_low=rng.choice(LOWS),
                                   ci_high=rng.choice(SPEEDUPS), n_samples=3)  # fmt: skip
    corr = None
    if rng.random() < 0.6:
        corr = CorrectnessEvidence(passed=rng.random() < 0.7,
                                   baseline_err_f64=rng.choice([None, 0.0, 1e-3]),
                                   candidate_err_f64=rng.choice([None, 0.0, 1e-5, 1e-3]))  # fmt: skip
    result = ExperimentResult(
        task="t", patch_id="p", reasons=[],
        verdict=rng.choice([Verdict.IMPROVED] * 6 + list(Verdict)),
        flags=[f for f in (Flag.SUSPICIOUS, Flag.HEALTH_WARNING) if rng.random() < 0.15],
        evidence=Evidence(performance=perf, correctness=corr),
    )  # fmt: skip
    return ExperimentRecord(run_id=run_id, task="t", patch_id=rng.choice(patches), result=result)


def _bundles(seed: int, n_runs: int = 120) -> list[RunBundle]:
    rng = random.Random(seed)
    bundles: list[RunBundle] = []
    for r in range(n_runs):
        run = RunRecord(task=f"t{r % 3}", objective="latency", policy="llm")
        steps = [StepRecord(run_id=run.id, role="user", content="go")]
        if r % 11:  # else no assistant message: the run forms no row
            steps.append(StepRecord(run_id=run.id, role="assistant", content="ok"))
        patches = [f"patch-{r}-{k}" for k in range(rng.choice([1, 2, 4]))]
        experiments = [
            _experiment(rng, run.id, patches) for _ in range(rng.choice([0, 1, 2, 4, 6]))
        ]
        earlier = [e for b in bundles for e in b.experiments]
        if earlier and rng.random() < 0.2:  # shared with an earlier run (a proposal's, no run id)
            experiments.append(rng.choice(earlier))
        proposals, decisions = [], {}
        for _ in range(rng.choice([0, 1, 2])):
            ids = [e.id for e in experiments]
            backing = rng.sample(ids, k=min(len(ids), rng.choice([0, 1, 2])))
            proposal = ProposalRecord(run_id=run.id, task="t", patch_id=rng.choice(patches),
                                      patch_hash=rng.choice(patches),
                                      experiment_ids=[*backing, *(["gone"] if rng.random() < 0.3 else [])],
                                      status=rng.choice(list(ProposalStatus)))  # fmt: skip
            proposals.append(proposal)
            decisions[proposal.id] = [
                DecisionRecord(proposal_id=proposal.id, reviewer="r",
                               action=rng.choice([DecisionAction.AUTO_APPROVE, *DecisionAction]),
                               patch_hash=rng.choice([proposal.patch_hash, "other"]))
                for _ in range(rng.choice([0, 1, 2]))
            ]  # fmt: skip
        bundles.append(RunBundle(run=run, steps=steps, experiments=experiments,
                                 proposals=proposals, decisions=decisions))  # fmt: skip
    return bundles


def _parquet(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("fmt", [ExportFormat.RL, ExportFormat.OPENAI_SFT])
def test_run_columns_give_the_rows_of_run_row(seed: int, fmt: ExportFormat) -> None:
    bundles = _bundles(seed)
    for weights in (RewardWeights(), RewardWeights(review=3.0, failure=0.3, correctness=0.1)):
        w = weights.model_dump()
        chat = ChatColumns.of_bundles(bundles)
        columns = RunColumns.of_bundles(bundles, chat, w)
        made = [(columns.reward[i], columns.verdicts[i], chat.skip(i)) for i in range(len(bundles))]
        kept = [i for i, m in enumerate(made) if m[2] is None]
        rows = [run_row(b, fmt, w) for b in bundles]
        assert made == [(r.reward, r.verdicts, r.skip) for r in rows]
        reference = arrow_table(fmt, [r.row for r in rows if r.skip is None])
        assert _parquet(columns.table(fmt, kept, None)) == _parquet(reference)
        every_other = kept[::2]  # any subset of the runs, in order
        reference = arrow_table(fmt, [rows[i].row for i in every_other])
        assert _parquet(columns.table(fmt, every_other, None)) == _parquet(reference)


def test_the_corners_are_hit() -> None:
    """The random runs do reach what the comparison is for."""
    bundles = _bundles(0)
    values: dict[str, Any] = {"nan": 0, "tie": 0, "no perf": 0, "patch twice": 0}
    for b in bundles:
        wins = [e for e in b.experiments
                if e.result.verdict is Verdict.IMPROVED and Flag.SUSPICIOUS not in e.result.flags]  # fmt: skip
        perfs = [e.result.evidence.performance for e in wins]
        values["nan"] += any(p is not None and math.isnan(p.speedup) for p in perfs)
        keys = [(p.ci_low >= 2, p.speedup) for p in perfs if p is not None]
        values["tie"] += len(keys) != len(set(keys))
        values["no perf"] += any(p is None for p in perfs)
        values["patch twice"] += len({e.patch_id for e in b.experiments}) < len(b.experiments)
    assert all(v >= 3 for v in values.values()), values
