"""What an eval does not count as solved (issue 33): a win flagged suspicious goes to a person,
and a win that did not hold when re-measured is a claim disproved; neither is solved, neither
counts in best or fast_p, and the report says how many were set aside and why. Attempts are
read from real runs in a real run store (no experiments are run here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from stored_records import stored_experiment, stored_run

from infra_agent.evals.attempt import attempt_result
from infra_agent.evals.metrics import cell, summarize
from infra_agent.evals.records import (
    AttemptRecord,
    EvalRecord,
    Reverification,
    SetAsideReason,
)
from infra_agent.evals.report import render_html, render_terminal, rows
from infra_agent.evals.reverify import best_win
from infra_agent.store import RunStore, open_store
from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import Flag, Verdict

TASK = "sglang-cpu-tiny"  # declares a constraint (ttft_p99_ms): success needs it shown met
SUSPICIOUS_213 = (
    "suspicious: speedup 213.00x is above the task's plausibility bound 20x: needs a human look"
)


def _experiment(
    store: RunStore, run_id: str, n: int, speedup: float, **kwargs: Any
) -> ExperimentRecord:
    return stored_experiment(store, run_id, TASK, n, speedup, **kwargs)


def _run(store: RunStore, index: int) -> str:
    return stored_run(store, TASK, index)


def _reverified(win: ExperimentRecord, verdict: str, speedup: float) -> Reverification:
    return Reverification(
        experiment_id=f"again-{win.id}", of_experiment=win.id, patch_id=win.patch_id,
        seed=1_000_000, verdict=verdict, speedup=speedup, disproved=verdict != "IMPROVED",
    )  # fmt: skip


def _attempts(db: Path) -> tuple[EvalRecord, list[AttemptRecord]]:
    """Four attempts: a clean win that held; a 213x suspicious win alone (the collapsed
    baseline of the issue); a win that did not hold on re-measurement; a suspicious 213x win
    beside a clean 1.4x one."""
    record = EvalRecord(suite="s", tasks=[TASK], policy="scripted", attempts=4)
    store = open_store(db)
    try:
        runs = [_run(store, i) for i in range(4)]
        clean = _experiment(store, runs[0], 0, 1.3)
        _experiment(store, runs[1], 1, 213.0, flags=[Flag.SUSPICIOUS], reasons=[SUSPICIOUS_213])
        lucky = _experiment(store, runs[2], 2, 1.5)
        _experiment(store, runs[3], 3, 213.0, flags=[Flag.SUSPICIOUS], reasons=[SUSPICIOUS_213])
        honest = _experiment(store, runs[3], 4, 1.4)
        assert best_win(store, runs[1]) is None  # nothing that could count: nothing re-measured
        assert best_win(store, runs[3]).id == honest.id  # type: ignore[union-attr]
        again = [_reverified(clean, "IMPROVED", 1.28), None,
                 _reverified(lucky, "NO_CHANGE", 1.01), _reverified(honest, "IMPROVED", 1.38)]  # fmt: skip
        results = [attempt_result(store, run, a) for run, a in zip(runs, again, strict=True)]
    finally:
        store.close()
    attempts = [
        AttemptRecord(
            id=AttemptRecord.make_id(record.id, TASK, i),
            eval_id=record.id,
            task=TASK,
            index=i,
            status="finished",
            run_id=run,
            result=r,
        )  # fmt: skip
        for i, (run, r) in enumerate(zip(runs, results, strict=True))
    ]
    return record, attempts


def test_a_suspicious_or_unheld_win_is_never_solved(tmp_path: Path) -> None:
    _, attempts = _attempts(tmp_path / "runs.db")
    held, suspicious, unheld, both = (a.result for a in attempts)
    assert held is not None and suspicious is not None and unheld is not None and both is not None
    assert held.solved and held.best_speedup == 1.3 and held.set_aside == []
    assert held.criteria_met == [True]
    # the collapsed baseline's 213x: meets the task's criterion, is IMPROVED, but set aside
    assert suspicious.criteria_met == [True] and suspicious.improved
    assert not suspicious.solved and suspicious.best_speedup is None
    (aside,) = suspicious.set_aside
    assert aside.why is SetAsideReason.SUSPICIOUS and aside.speedup == 213.0
    assert "plausibility bound" in aside.detail and not aside.detail.startswith("suspicious: ")
    assert not unheld.solved and unheld.best_speedup is None and unheld.improved
    (aside,) = unheld.set_aside
    assert aside.why is SetAsideReason.NOT_HELD and "NO_CHANGE" in aside.detail
    assert both.solved and both.best_speedup == 1.4  # the honest win counts, the 213x does not
    assert [a.why for a in both.set_aside] == [SetAsideReason.SUSPICIOUS]
    assert both.first_win is not None and both.first_win.experiments == 2


def test_the_eval_counts_and_reports_what_it_set_aside(tmp_path: Path) -> None:
    record, attempts = _attempts(tmp_path / "runs.db")
    c = cell("scripted", "dense", TASK, attempts, 4)
    assert (c.solved, c.improved) == (2, 4)
    assert c.set_aside == {"suspicious": 2, "not held": 1}
    assert c.best_speedup == 1.4 and sorted(c.speedups) == [1.3, 1.4]
    assert c.fast_p["1"] == 0.5 and c.fast_p["2"] == 0.0  # 213x counted nowhere
    summary = summarize(record, attempts)
    (row, _) = rows([summary])
    assert row["solved"] == "2/4" and row["set aside"] == "3 (2 suspicious, 1 not held)"
    console = Console(record=True, width=400)
    render_terminal([summary], console)
    text = console.export_text()
    assert "set aside" in text and "3 (2 suspicious, 1 not held)" in text
    assert "attempt 1: win 213.000x" in text and "suspicious: speedup 213.00x is above" in text
    assert "attempt 2: win 1.500x" in text and "not held: re-measured on fresh seeds: NO_CHANGE" in text  # fmt: skip
    page = render_html([summary])
    assert "<h2>Wins set aside</h2>" in page and page.count("set aside, ") == 3


def test_a_re_measurement_whose_baseline_failed_is_not_verified_not_disproved(
    tmp_path: Path,
) -> None:
    """The eval's re-measurement could not start its baseline server (a loaded machine's OOM,
    seen in a relay run): the claim is set aside as not verified, with the reason, and is not
    counted as disproved."""
    store = open_store(tmp_path / "runs.db")
    try:
        run = _run(store, 0)
        win = _experiment(store, run, 0, 2.66)
        reason = "baseline failed, so nothing can be compared (task or sandbox problem): exit 137"
        again = Reverification(
            experiment_id="again", of_experiment=win.id, patch_id=win.patch_id, seed=1,
            verdict="FAILED", flags=["baseline_failed"], disproved=False, unverified=True,
            reason=reason,
        )  # fmt: skip
        result = attempt_result(store, run, again)
    finally:
        store.close()
    assert not result.solved and result.improved
    (aside,) = result.set_aside
    assert aside.why is SetAsideReason.NOT_VERIFIED and "exit 137" in aside.detail
    attempt = AttemptRecord(id="a", eval_id="e", task=TASK, index=0, status="finished",
                            run_id=run, result=result)  # fmt: skip
    c = cell("scripted", "dense", TASK, [attempt], 1)
    assert c.disproved == 0 and c.set_aside == {"not verified": 1}


def test_reverify_tries_again_when_the_baseline_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-measurement whose baseline failed is run once more on the next seed; two failed
    baselines make the claim unverified. (run_experiment is replaced by recorded outcomes:
    the experiment itself is tested elsewhere; here only what reverify does with them.)"""
    from infra_agent.evals import reverify as module

    db = tmp_path / "runs.db"
    store = open_store(db)
    run = _run(store, 0)
    win = _experiment(store, run, 0, 2.66)
    store.close()
    seeds: list[int] = []

    def outcomes(*verdicts: tuple[Verdict, list[Flag]]) -> None:
        queue = list(verdicts)

        def fake(task: object, patch: object, **kw: object) -> ExperimentRecord:
            verdict, flags = queue.pop(0)
            seeds.append(int(kw["seed"]))  # type: ignore[call-overload]
            store: RunStore = kw["store"]  # type: ignore[assignment]
            return _experiment(store, run, 9, 2.0, verdict=verdict, flags=flags,
                               reasons=["baseline failed, so nothing can be compared"])  # fmt: skip

        monkeypatch.setattr(module, "run_experiment", fake)

    failed = (Verdict.FAILED, [Flag.BASELINE_FAILED])
    outcomes(failed, (Verdict.IMPROVED, []))
    again = module.reverify(db, run)
    assert again is not None and again.verdict == "IMPROVED" and not again.disproved
    assert seeds[1] == seeds[0] + 1 and again.seed == seeds[1] and not again.unverified
    outcomes(failed, failed)
    again = module.reverify(db, run)
    assert again is not None and again.unverified and not again.disproved
    assert again.of_experiment == win.id and again.reason.startswith("better with confidence")


def test_each_attempt_works_toward_its_own_tasks_objective() -> None:
    """An eval over tasks of several objectives: each attempt's run is told its task's own (a
    relay run on sglang-garbled-under-load was told 'Objective of this run: throughput' for a
    correctness task)."""
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.evals.attempt import attempt_config

    record = EvalRecord(suite="s", tasks=["sglang-garbled-under-load", "example-matmul"],
                        policy="scripted", attempts=1,
                        config=RunConfig(task="-").model_dump(mode="json"))  # fmt: skip
    for task, objective in (("sglang-garbled-under-load", "correctness"),
                            ("chunked-state-precision", "accuracy"),
                            ("example-matmul", "latency")):  # fmt: skip
        attempt = AttemptRecord(id=f"a-{task}", eval_id=record.id, task=task, index=2)
        config = attempt_config(record, attempt)
        assert (config.task, config.seed, config.objective) == (task, 2, objective)


def test_reverify_extends_an_unresolved_re_measurement_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-measurement that ends NO_CHANGE underpowered (8 pairs, as a relay run's did after the
    run itself had needed an extension to resolve the same win) gets more pairs on the same
    patch before the claim is judged; the extension's verdict is the re-measurement's."""
    from infra_agent.evals import reverify as module

    db = tmp_path / "runs.db"
    store = open_store(db)
    run = _run(store, 0)
    win = _experiment(store, run, 0, 1.62)
    store.close()
    calls: list[object] = []

    def fake(task: object, patch: object, **kw: object) -> ExperimentRecord:
        calls.append(kw.get("extend"))
        store: RunStore = kw["store"]  # type: ignore[assignment]
        if kw.get("extend") is None:
            first = _experiment(store, run, 8, 1.26, verdict=Verdict.NO_CHANGE,
                                flags=[Flag.UNDERPOWERED])  # fmt: skip
            perf = first.result.evidence.performance
            assert perf is not None
            perf.all_samples = {"baseline": {"output_throughput": [1.0] * 8},
                                "candidate": {"output_throughput": [1.26] * 8}}  # fmt: skip
            return first
        return _experiment(store, run, 9, 1.55)

    monkeypatch.setattr(module, "run_experiment", fake)
    again = module.reverify(db, run)
    assert again is not None and len(calls) == 2 and calls[0] is None
    assert isinstance(calls[1], ExperimentRecord) and Flag.UNDERPOWERED in calls[1].result.flags
    assert again.verdict == "IMPROVED" and not again.disproved and again.of_experiment == win.id
