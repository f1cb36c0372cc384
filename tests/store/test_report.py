"""An experiment record's own projection for `infra-agent experiment --json` (no view copy)."""

from __future__ import annotations

import json
import math

from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    SandboxEvidence,
    Verdict,
)


def _record(speedup: float) -> ExperimentRecord:
    perf = PerformanceEvidence(
        metric="latency_ms", unit="ms", higher_is_better=False, baseline_median=2.0,
        candidate_median=1.0, speedup=speedup, ci_low=1.5, ci_high=2.5, n_samples=8,
        baseline_samples=[2.0, 2.1], candidate_samples=[1.0, 1.1],
    )  # fmt: skip
    evidence = Evidence(
        performance=perf, correctness=CorrectnessEvidence(passed=True, checks=2),
        sandbox=SandboxEvidence(backend="local"), durations_s={"static": 0.1},
    )  # fmt: skip
    result = ExperimentResult(
        task="t", patch_id="p", verdict=Verdict.IMPROVED, reasons=["faster"],
        flags=[Flag.HEALTH_WARNING], evidence=evidence,
    )  # fmt: skip
    return ExperimentRecord(task="t", patch_id="p", result=result)


def test_the_report_lifts_the_decisive_evidence_and_summarizes_performance() -> None:
    record = _record(2.0)
    report = json.loads(json.dumps(record.report()))
    assert list(report) == [
        "experiment_id", "task", "patch_id", "verdict", "reasons", "flags", "correctness",
        "performance", "sandbox", "durations_s", "evidence",
    ]  # fmt: skip
    assert (report["experiment_id"], report["verdict"], report["flags"]) == (
        record.id,
        "IMPROVED",
        ["health_warning"],
    )
    assert report["performance"] == {
        "metric": "latency_ms", "unit": "ms", "higher_is_better": False, "baseline_median": 2.0,
        "candidate_median": 1.0, "speedup": 2.0, "ci_low": 1.5, "ci_high": 2.5,
        "confidence": 0.95, "n_samples": 8,
    }  # fmt: skip
    for key in ("correctness", "sandbox", "durations_s"):
        assert report[key] == report["evidence"][key]
    assert report["evidence"]["performance"]["baseline_samples"] == [2.0, 2.1]


def test_a_nan_gain_is_written_as_the_record_writes_it() -> None:
    text = json.dumps(_record(math.nan).report())
    assert '"speedup": NaN' in text
    assert math.isnan(json.loads(text)["performance"]["speedup"])
