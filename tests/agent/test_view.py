"""The live view's experiments table: a verdict a constraint decided says which one (a knob
search's summary showed 'REGRESSED' beside a throughput interval touching 1, the p99 TTFT
constraint's doing, with nothing to tell so)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from stored_records import stored_experiment, stored_run

from infra_agent.agent.state import ExperimentOutcome
from infra_agent.agent.view import experiments_table
from infra_agent.store import open_store
from infra_agent.store.verdict import Verdict


def test_a_verdict_decided_by_a_broken_constraint_names_it(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    run_id = stored_run(store, "sglang-cpu-tiny", 0)
    broken = "constraint broken: ttft_p99_ms median 900 -> 1400 (ratio 1.556, 95% CI 1.3-1.8, allowed 1.2)"  # fmt: skip
    records = [
        stored_experiment(
            store, run_id, "sglang-cpu-tiny", 1, 0.98, verdict=Verdict.REGRESSED, reasons=[broken]
        ),  # fmt: skip
        stored_experiment(store, run_id, "sglang-cpu-tiny", 2, 1.3),
    ]
    outcomes = [ExperimentOutcome.of(r, store.get_patch(r.patch_id), reused=False) for r in records]
    assert [o.broken_constraint for o in outcomes] == ["ttft_p99_ms", None]
    console = Console(record=True, width=160)
    console.print(experiments_table(outcomes))
    text = console.export_text()
    assert "REGRESSED by ttft_p99_ms" in text and "IMPROVED by" not in text
