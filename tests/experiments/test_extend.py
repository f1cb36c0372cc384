"""An underpowered verdict can be extended (issue 34 item 9): the earlier pairs come first and at
most max_samples more are taken, only on the same arms, only for an unresolved NO_CHANGE; every
other verdict is refused in one line. Recorded sglang-cpu-tiny samples replayed through the
statistics, and the fast pure-Python test task through the whole cascade."""

from __future__ import annotations

import math

import pytest
from recorded_samples import Replay, aa_pairs, arms, script_timing

from infra_agent.errors import UserError
from infra_agent.experiments import run_experiment
from infra_agent.experiments.arms import SeedSource
from infra_agent.experiments.extend import Prior, extendable, extension_refusal
from infra_agent.experiments.measure import decide, evidence, measure
from infra_agent.experiments.verdict_text import verdict_text
from infra_agent.store import open_store
from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import (
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    StopReason,
    Verdict,
)
from infra_agent.tasks.manifest import TaskManifest
from infra_agent.tasks.registry import find_task


@pytest.fixture
def manifest() -> TaskManifest:
    m = find_task("sglang-cpu-tiny").manifest
    return m.model_copy(update={"budget": m.budget.model_copy(update={"max_samples": 12})})


def _recorded(manifest: TaskManifest, harness: Replay, prior: Prior | None = None) -> ExperimentRecord:  # fmt: skip
    m = measure(harness, *arms(), manifest, SeedSource(), deadline=math.inf, prior=prior)
    verdict, reasons, flags, metrics = decide(m, manifest)
    result = ExperimentResult(
        task=manifest.name, patch_id="p" * 64, verdict=verdict, reasons=reasons, flags=flags,
        evidence=Evidence(performance=evidence(m, manifest), metrics=metrics),
    )  # fmt: skip
    return ExperimentRecord(task=manifest.name, patch_id="p" * 64, result=result)


def test_an_extension_continues_from_the_earlier_pairs(manifest: TaskManifest) -> None:
    """The recorded baseline as an A/A experiment: 12 pairs are underpowered; the extension
    starts from them and samples the next recorded ones."""
    recorded = aa_pairs()
    harness = Replay(manifest, recorded)
    first = _recorded(manifest, harness)
    assert first.result.verdict is Verdict.NO_CHANGE and Flag.UNDERPOWERED in first.result.flags
    assert extension_refusal(first) is None
    assert f"extendable: extend={first.id} adds up to 12 pairs/arm" in verdict_text(first, manifest)
    later = _recorded(manifest, harness, Prior.of(first))  # the replay goes on where it stopped
    perf, earlier = later.result.evidence.performance, first.result.evidence.performance
    assert perf is not None and earlier is not None
    assert (perf.extended_from, perf.reused_pairs) == (first.id, 12)
    assert 12 < perf.n_samples <= 24 and perf.stopped is not None
    for arm, taken in recorded.items():
        values = perf.all_samples[arm]["output_throughput"]
        assert values[:12] == earlier.all_samples[arm]["output_throughput"]
        assert values == [s["output_throughput"] for s in taken[: perf.n_samples]]
    assert perf.wanted_effect == earlier.wanted_effect  # asked what its start asked
    head = later.result.render().splitlines()[0]
    assert (
        f"n={perf.n_samples}/arm, 12 of them reused from {first.id} (extended); sampling stopped at the budget's max_samples)"
        in head
    ), head


def _result(
    verdict: Verdict,
    *,
    flags: tuple[Flag, ...] = (),
    stopped: StopReason | None = None,
    perf: bool = True,
) -> ExperimentRecord:
    performance = PerformanceEvidence(
        metric="t", unit="ms", higher_is_better=False, baseline_median=1.0, candidate_median=1.0,
        speedup=1.0, ci_low=0.9, ci_high=1.1, n_samples=12, detectable_effect=1.12,
        wanted_effect=1.2, stopped=stopped, all_samples={"baseline": {"t": [1.0]}, "candidate": {"t": [1.0]}},
    )  # fmt: skip
    result = ExperimentResult(
        task="t", patch_id="p", verdict=verdict, reasons=[], flags=list(flags),
        evidence=Evidence(stage_reached="performance" if perf else "correctness",
                          performance=performance if perf else None),
    )  # fmt: skip
    return ExperimentRecord(id="exp-1", task="t", patch_id="p", result=result)


def test_only_an_unresolved_no_change_is_extendable() -> None:
    said = extension_refusal
    assert said(_result(Verdict.NO_CHANGE, flags=(Flag.UNDERPOWERED,))) is None
    # stopped at the budget before settling (the sign test overruling the interval, say)
    assert said(_result(Verdict.NO_CHANGE, stopped=StopReason.MAX_SAMPLES)) is None
    assert said(_result(Verdict.IMPROVED)) == (
        "exp-1 is IMPROVED: decided, more pairs would not change it; propose another patch to go "
        "further"
    )
    assert said(_result(Verdict.INCORRECT, perf=False)) == (
        "exp-1 ended INCORRECT at the correctness stage: it has no pairs to extend; fix the "
        "patch and propose it again"
    )
    assert said(_result(Verdict.NO_CHANGE, stopped=StopReason.RESOLVED)) == (
        "exp-1 is a resolved NO_CHANGE (it detects changes of 12.0% or more; 20.0% was asked): "
        "more pairs would not change it; try a different patch"
    )


def test_the_cascade_extends_on_the_same_arms_only(pytask, make_patch, tmp_path) -> None:
    """The test task with scripted latencies (no verdict hangs on the machine's load), asked to
    see 5.1% against a minimum effect of 5%, which no budget can: NO_CHANGE underpowered;
    extended once on the same arms, and refused with other parameters, twice, or with a
    resolution of its own."""
    task = pytask()
    script_timing(task.root)
    patch = make_patch(task, "kernel.py", (task.workspace / "kernel.py").read_text() + "\n")
    store = open_store(tmp_path / "runs.db")
    first = run_experiment(task, patch, store=store, run_id="run-1", detect=0.051)
    assert first.result.verdict is Verdict.NO_CHANGE and Flag.UNDERPOWERED in first.result.flags, first.result.render()  # fmt: skip
    earlier = first.result.evidence.performance
    assert (
        earlier is not None and earlier.all_samples and first.result.evidence.params == {"n": 400}
    )
    with pytest.raises(UserError, match="a different task parameters"):
        run_experiment(task, patch, params={"n": 401}, extend=first)
    with pytest.raises(UserError, match="keeps the earlier experiment's resolution"):
        run_experiment(task, patch, extend=first, detect=0.2)
    assert extendable(store, "run-1", first.id).id == first.id  # may be extended, in its run
    with pytest.raises(UserError, match=f"no experiment '{first.id}' in this run"):
        extendable(store, "run-2", first.id)
    later = run_experiment(task, patch, store=store, run_id="run-1", extend=first)
    perf = later.result.evidence.performance
    assert later.result.verdict not in (Verdict.FAILED, Verdict.REJECTED), later.result.render()
    assert perf is not None and (perf.extended_from, perf.reused_pairs) == (first.id, earlier.n_samples)  # fmt: skip
    assert perf.all_samples["candidate"]["latency_ms"][: earlier.n_samples] == earlier.candidate_samples  # fmt: skip
    assert earlier.n_samples < perf.n_samples <= earlier.n_samples + task.manifest.budget.max_samples  # fmt: skip
    assert later.result.evidence.correctness is not None  # the new arms were checked again
    with pytest.raises(UserError, match=f"was extended already, by {later.id}; extend that one"):
        extendable(store, "run-1", first.id)
