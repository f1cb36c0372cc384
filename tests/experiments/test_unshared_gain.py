"""A serving win its companion does not share is suspicious (issue 33): throughput up far more
than output tokens per server CPU-second means the candidate's server used more CPU per second
than the baseline's, what starving the baseline produces. Recorded samples of a real
sglang-cpu-tiny experiment (tests/experiments/data) are replayed through the statistics; the
honest and sabotaged arms are built from them deterministically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra_agent.experiments.companion import UNSHARED_LIMIT
from infra_agent.experiments.measure import Measurement, decide
from infra_agent.feedback.bench import compare_samples
from infra_agent.review.risk import assess
from infra_agent.store.records import RiskLevel
from infra_agent.store.verdict import ExperimentResult, Flag, Verdict
from infra_agent.tasks.manifest import TaskManifest
from infra_agent.tasks.patch import knob_patch
from infra_agent.tasks.registry import find_task

RECORDED = Path(__file__).parent / "data" / "sglang_cpu_tiny_batch16.json"
Samples = dict[str, list[float]]


@pytest.fixture(scope="module")
def manifest() -> TaskManifest:
    return find_task("sglang-cpu-tiny").manifest


def _recorded() -> tuple[Samples, Samples]:
    data = json.loads(RECORDED.read_text())
    return data["baseline"], data["candidate"]


def _decide(base: Samples, cand: Samples, manifest: TaskManifest) -> tuple[Verdict, list[str], list[Flag], dict[str, float]]:  # fmt: skip
    n = min(len(base["output_throughput"]), len(cand["output_throughput"]))
    base, cand = {k: v[:n] for k, v in base.items()}, {k: v[:n] for k, v in cand.items()}
    comparison = compare_samples(base["output_throughput"], cand["output_throughput"],
                                 higher_is_better=True, paired=True, equivalence=manifest.min_effect)  # fmt: skip
    return decide(Measurement(comparison, base, cand), manifest)


def _pairs(arm: Samples) -> tuple[Samples, Samples]:
    """One arm's samples as an A/A experiment: each sample against the next one measured (the
    ABBA order puts them next to each other in time)."""
    return {k: v[0::2] for k, v in arm.items()}, {k: v[1::2] for k, v in arm.items()}


def _scaled(arm: Samples, throughput: float, per_cpu: float) -> Samples:
    return {
        **arm,
        "output_throughput": [v * throughput for v in arm["output_throughput"]],
        "output_tokens_per_cpu_s": [v * per_cpu for v in arm["output_tokens_per_cpu_s"]],
    }


def test_the_recorded_batch_size_win_is_not_suspicious(manifest: TaskManifest) -> None:
    """max-running-requests 16 against 4, measured on a loaded 2-core machine: throughput
    1.99x, tokens per server CPU-second 1.80x (1.10x unshared)."""
    verdict, reasons, flags, metrics = _decide(*_recorded(), manifest)
    assert verdict is Verdict.IMPROVED and Flag.SUSPICIOUS not in flags, reasons
    assert metrics["output_tokens_per_cpu_s_speedup"] == pytest.approx(1.803, abs=0.001)
    assert not any(r.startswith("suspicious: ") for r in reasons)


@pytest.mark.parametrize("arm", [0, 1])
def test_an_honest_win_the_cpu_efficiency_shares_is_not_flagged(manifest: TaskManifest, arm: int) -> None:  # fmt: skip
    """1.3x throughput with 1.25x tokens per CPU-second on top of recorded A/A pairs."""
    base, cand = _pairs(_recorded()[arm])
    verdict, reasons, flags, metrics = _decide(base, _scaled(cand, 1.3, 1.25), manifest)
    assert verdict is Verdict.IMPROVED and Flag.SUSPICIOUS not in flags, reasons
    assert 1.15 < metrics["output_tokens_per_cpu_s_speedup"] < 1.35


@pytest.mark.parametrize("arm", [0, 1])
def test_a_starved_baseline_is_flagged_with_the_disagreement_in_numbers(manifest: TaskManifest, arm: int) -> None:  # fmt: skip
    """The baseline's server stopped for 3/8 of every sample (SIGSTOP from the candidate): its
    throughput falls 1.6x while its tokens per CPU-second do not move (1.01x)."""
    base, cand = _pairs(_recorded()[arm])
    verdict, reasons, flags, metrics = _decide(_scaled(base, 1 / 1.6, 1 / 1.01), cand, manifest)
    assert verdict is Verdict.IMPROVED and Flag.SUSPICIOUS in flags, reasons
    (why,) = [r for r in reasons if r.startswith("suspicious: ")]
    starved = _scaled(base, 1 / 1.6, 1 / 1.01)["output_throughput"]
    speedup = compare_samples(starved, cand["output_throughput"], higher_is_better=True,
                              paired=True, equivalence=manifest.min_effect).speedup  # fmt: skip
    per_cpu = metrics["output_tokens_per_cpu_s_speedup"]
    assert f"output_throughput {speedup:.2f}x but output_tokens_per_cpu_s {per_cpu:.2f}x" in why
    assert speedup / per_cpu > UNSHARED_LIMIT and "needs a human look" in why
    # and the review queue's risk policy sends it to a person, quoting why
    patch = knob_patch({"max-running-requests": 16}).to_record()
    result = ExperimentResult(task="sglang-cpu-tiny", patch_id=patch.id, verdict=verdict,
                              reasons=reasons, flags=flags)  # fmt: skip
    risk = assess(patch, result)
    assert risk.level is RiskLevel.HIGH and risk.action.value == "review"
    assert any(r.startswith("flag suspicious: output_throughput") for r in risk.reasons), risk


def test_a_large_win_whose_extra_cpu_is_a_minor_part_is_not_flagged(manifest: TaskManifest) -> None:  # fmt: skip
    """5x throughput with 3.7x tokens per CPU-second: 1.35x of the gain is more CPU per second
    (the tokenizer process streams five times the tokens), less than the companion's own."""
    base, cand = _pairs(_recorded()[1])
    verdict, reasons, flags, _ = _decide(base, _scaled(cand, 5.0, 3.7), manifest)
    assert verdict is Verdict.IMPROVED and Flag.SUSPICIOUS not in flags, reasons


def test_without_a_companion_or_without_a_win_nothing_is_flagged(manifest: TaskManifest) -> None:
    base, cand = _pairs(_recorded()[1])
    starved = _scaled(base, 1 / 1.6, 1 / 1.01)
    alone = manifest.model_copy(update={"metric": manifest.metric.model_copy(update={"companion": None})})  # fmt: skip
    assert Flag.SUSPICIOUS not in _decide(starved, cand, alone)[2]
    verdict, _, flags, _ = _decide(cand, starved, manifest)  # the other way round: REGRESSED
    assert verdict is Verdict.REGRESSED and Flag.SUSPICIOUS not in flags


@pytest.mark.parametrize(
    "name",
    ["sglang-cpu-tiny", "sglang-slow-decode", "sglang-stalled-scheduler", "sglang-queue-collapse"],
)
def test_cpu_serving_throughput_tasks_declare_the_cpu_companion(name: str) -> None:
    """Without a companion nothing is compared: each CPU serving task judged on throughput
    names tokens per server CPU-second (their reference fixes share 0.99-1.10x of the gain)."""
    metric = find_task(name).manifest.metric
    assert (metric.name, metric.companion) == ("output_throughput", "output_tokens_per_cpu_s")
