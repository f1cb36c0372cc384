"""`tasks check` states how far the faulty baseline's medians lay apart across its experiments
and fails a task whose baseline swings as much as its symptom (issue 35: such a task cannot score
an agent). The experiments are stand-ins: this is the check's logic, not a measurement."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infra_agent.experiments import run as run_module
from infra_agent.experiments.check import check_task
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.registry import find_task


def _record(verdict: Verdict, baseline: float, candidate: float) -> SimpleNamespace:
    perf = SimpleNamespace(
        metric="output_throughput", unit="tok/s", speedup=candidate / baseline, ci_low=0.9,
        ci_high=1.1, baseline_median=baseline, candidate_median=candidate,
    )  # fmt: skip
    result = SimpleNamespace(
        verdict=verdict, reasons=[], evidence=SimpleNamespace(performance=perf)
    )
    return SimpleNamespace(id=f"exp-{baseline}", result=result)


@pytest.mark.parametrize(
    ("baselines", "verdict", "passed"),
    [((500.0, 480.0, 510.0), "STEADY", True), ((500.0, 250.0, 510.0), "UNSTEADY", False)],
)
def test_the_baseline_row_sets_the_spread_against_the_symptom(
    monkeypatch: pytest.MonkeyPatch, baselines: tuple[float, ...], verdict: str, passed: bool
) -> None:
    """Symptom 1.6x, reference 1.5x, wrong fix 1.0x on baselines 500/480/510 (within 1.06x: steady)
    or 500/250/510 (within 2.04x, wider than the symptom: the check fails on that row alone)."""
    gains = iter(zip(baselines, (1.6, 1.5, 1.0), strict=True))
    verdicts = iter((Verdict.IMPROVED, Verdict.IMPROVED, Verdict.NO_CHANGE))

    def run(task: object, patch: object, **_: object) -> SimpleNamespace:
        base, gain = next(gains)
        return _record(next(verdicts), base, base * gain)

    monkeypatch.setattr(run_module, "run_experiment", run)
    result = check_task(find_task("sglang-slow-decode"))
    rows = {row.question: row for row in result.rows}
    assert [r.ok for q, r in rows.items() if q != "baseline"] == [True, True, True]
    row = rows["baseline"]
    assert row.verdict == verdict and row.ok is passed and result.passed is passed
    assert (
        f"within {max(baselines) / min(baselines):.3g}x, against the symptom's 1.6x" in row.number
    )
    assert "tok/s over 3 experiments" in row.number and "baseline: " + verdict in result.render()


def test_one_measured_baseline_states_no_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    """An open task measures only its reference: nothing to compare, and the row says so."""
    monkeypatch.setattr(
        run_module, "run_experiment", lambda *a, **k: _record(Verdict.IMPROVED, 100.0, 150.0)
    )
    result = check_task(find_task("sglang-open-cpu-batch-job"))
    row = result.rows[-1]
    assert row.question == "baseline" and row.ok is None and result.passed
    assert "1 experiment(s) measured the baseline" in row.number
