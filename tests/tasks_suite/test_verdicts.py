"""The six scaling-pain tasks through the real experiment engine: the reference patch fixes each
task to its stated numbers, and a plausible wrong fix is rejected or shows no improvement.

Every experiment runs the arms' code in the local sandbox with fresh seeds. Where a verdict rests
on the clock (a speedup, a time or overlap constraint, a transfer overhead), the task copy reports
the samples of a recorded real experiment of the same patch in place of its clock
(tests/recorded_samples.py `replay_timing`; recorded by benchmarks/record_samples.py, each file
says when and at what load): the code still runs and is checked on every sample, and the verdict
is the one those samples give, whatever the load of the machine running the suite. How far each
fix's real effect lies from its threshold, and how often, is benchmarks/bench_verdict_margins.py's
measurement. Verdicts on a precision metric, a correctness failure or an invariant are measured
here. Numbers are printed (`-s` shows them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from recorded_samples import replay_timing

from infra_agent.experiments import run_experiment
from infra_agent.store.verdict import ExperimentResult, Verdict
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.patch import Patch, load_patch
from infra_agent.tasks.registry import find_task

pytestmark = pytest.mark.slow

TASKS = [
    "decode-split-norm",
    "chunked-state-precision",
    "kv-transfer-gil",
    "pd-kv-reuse-race",
    "tiered-cache-load-order",
    "batch-invariant-moe",
]


def _show(label: str, result: ExperimentResult) -> ExperimentResult:
    print(f"\n[{label}] {result.render()}")
    print(json.dumps(result.evidence.metrics | {"health": result.evidence.health}, default=str))
    print("durations_s", result.evidence.durations_s)
    return result


def experiment(task: str, patch_file: str, **params: object) -> ExperimentResult:
    """The bundled task's own experiment of `patch_file`, measured here."""
    t = find_task(task)
    record = run_experiment(t, load_patch(t.root / patch_file), params=params or None)
    return _show(f"{task} / {patch_file}", record.result)


def replayed(
    tmp: Path, task: str, patch: str | Patch, case: str, keys: tuple[str, ...] = ()
) -> ExperimentResult:
    """The experiment of `patch` (a file of the task, or a Patch) on a copy of `task` whose
    samples report recording `case` (only `keys` of it when given) in place of its clock."""
    root = tmp / task
    shutil.copytree(find_task(task).root, root)
    replay_timing(root, case, keys)
    t = load_task(root)
    chosen = load_patch(root / patch) if isinstance(patch, str) else patch
    return _show(f"{task} / {case} (recorded timing)", run_experiment(t, chosen).result)


def metric(result: ExperimentResult, name: str) -> float:
    return result.evidence.metrics[name]


def test_decode_split_norm_fix_is_at_least_1_5x(tmp_path: Path) -> None:
    """The fix's step times as recorded (2.68x); the real margin to 1.5x is
    benchmarks/bench_verdict_margins.py split-norm-reference's (8 runs at load 2: 2.39-3.03x)."""
    result = replayed(tmp_path, "decode-split-norm", "reference.patch", "split-norm-reference")
    assert result.verdict == Verdict.IMPROVED, result.reasons
    assert result.evidence.performance is not None
    assert result.evidence.performance.speedup >= 1.5
    assert result.evidence.correctness is not None and result.evidence.correctness.passed


def test_decode_split_norm_wrong_fix_is_incorrect() -> None:
    result = experiment("decode-split-norm", "wrong_fix.patch")
    assert result.verdict == Verdict.INCORRECT, result.reasons


def test_chunked_state_precision_fix_meets_threshold(tmp_path: Path) -> None:
    """The drift (rel_err) measured here; the time constraint (<= 1.3x) on recorded times."""
    result = replayed(
        tmp_path, "chunked-state-precision", "reference.patch", "chunked-reference", ("time_ms",)
    )
    assert result.verdict == Verdict.IMPROVED, result.reasons
    perf = result.evidence.performance
    assert perf is not None
    threshold = find_task("chunked-state-precision").manifest.params["fixed_threshold"]
    assert perf.baseline_median > threshold, "baseline should show the drift"
    assert max(perf.candidate_samples) < threshold
    # The time constraint (<= 1.3x) held, or the verdict would be REGRESSED.


def test_chunked_state_precision_wrong_stage_shows_no_improvement() -> None:
    result = experiment("chunked-state-precision", "wrong_fix.patch")
    assert result.verdict in (Verdict.NO_CHANGE, Verdict.REGRESSED), result.reasons


def test_kv_transfer_gil_fix_removes_the_overhead(tmp_path: Path) -> None:
    """Step times and transfer overheads as recorded (the overhead is a share of clocked time)."""
    result = replayed(tmp_path, "kv-transfer-gil", "reference.patch", "kv-gil-reference")
    assert result.verdict == Verdict.IMPROVED, result.reasons
    base = metric(result, "baseline_transfer_overhead_pct")
    cand = metric(result, "candidate_transfer_overhead_pct")
    print(f"transfer overhead (median per sample): baseline {base:.1f}% -> candidate {cand:.1f}%")
    assert base > 30.0
    assert cand < 5.0


def test_kv_transfer_gil_switch_interval_does_not_help(tmp_path: Path) -> None:
    """Step times and transfer overheads as recorded (0.99x): the verdict those samples give."""
    result = replayed(tmp_path, "kv-transfer-gil", "wrong_fix.patch", "kv-gil-wrong")
    assert result.verdict in (Verdict.NO_CHANGE, Verdict.REGRESSED), result.reasons
    assert metric(result, "candidate_transfer_overhead_pct") > 20.0


@pytest.mark.long
def test_pd_kv_reuse_race_fix_has_zero_corruptions() -> None:
    """Long tier: its throughput constraint (shown within 1.2x at 95%) has no bound at 1 in
    1,000 under load: 4 of 4 passed at load 4 with up to 16 pairs, the interval's top 1.06-1.19;
    with 8 pairs a suite run read 0.88-1.225 (NO_CHANGE). In CI the fix's correctness with the
    race forced is test_diagnose.py's and the invariant's; benchmarks/bench_verdict_margins.py
    pd-kv-reference measures the verdict."""
    # The baseline used to hang here in suite runs (2 of 3 at load 2-4): its stall odds grew with
    # the transfer queue, aborted writes stay queued, so one slow moment could tip it into a
    # retry storm that never drained (queue 63k after 50 s, seen by hand). Stalls are now drawn
    # from the seed alone (prefill.py). False failure: the fix never corrupts (its slots are
    # freed only after prefill's acknowledgement), so the test fails only if the baseline shows
    # no corruption in its 10,000-request health run or too few pooled in 12,000-32,000 sample
    # requests. Seeded stalls in 10,000 requests are Poisson(10), each an abort (stalls >= 25 ms,
    # timeout 20 ms), and an abort corrupted a request 0.75 of the time (150 of ~200, 20 runs at
    # load 4-7): P(no corruption) = exp(-10 * 0.75) = 5.5e-4 per run, the rest far smaller.
    result = experiment("pd-kv-reuse-race", "reference.patch")
    assert result.verdict == Verdict.IMPROVED, result.reasons
    health = result.evidence.health
    assert health["baseline_corruptions"] > 0, "baseline should corrupt under load"
    assert health["candidate_corruptions"] == 0
    # Throughput shown within 20%: otherwise the verdict would be NO_CHANGE or REGRESSED.
    ratio = metric(result, "candidate_requests_per_s") / metric(result, "baseline_requests_per_s")
    print(f"throughput ratio candidate/baseline {ratio:.3f}")


def test_pd_kv_reuse_race_sleep_before_free_is_rejected() -> None:
    result = experiment("pd-kv-reuse-race", "wrong_fix.patch")
    assert result.verdict in (Verdict.INCORRECT, Verdict.REGRESSED), result.reasons


def test_tiered_cache_fix_has_zero_reads_before_ready_and_keeps_overlap(tmp_path: Path) -> None:
    """Samples (race counts and overlap, both clocked) as recorded; the health runs are real.
    False failure: the baseline's health run (5,000 requests at 28-532 per 10k) shows no
    read-before-ready with probability below exp(-14) = 8e-7; the fix's count is 0 by
    construction (it reads a layer only once it is loaded). The overlap constraint's real
    margin: benchmarks/bench_verdict_margins.py tiered-reference."""
    result = replayed(tmp_path, "tiered-cache-load-order", "reference.patch", "tiered-reference")
    assert result.verdict == Verdict.IMPROVED, result.reasons
    health = result.evidence.health
    assert health["baseline_read_before_ready"] > 0
    assert health["candidate_read_before_ready"] == 0
    base, cand = metric(result, "baseline_overlap_ratio"), metric(result, "candidate_overlap_ratio")
    print(f"overlap ratio baseline {base:.3f} -> candidate {cand:.3f}")
    assert cand >= base / 1.1


def test_tiered_cache_loading_everything_first_loses_the_overlap(tmp_path: Path) -> None:
    """The overlap constraint on recorded samples of this wrong fix: REGRESSED, naming it."""
    result = replayed(tmp_path, "tiered-cache-load-order", "wrong_fix.patch", "tiered-wrong")
    assert result.verdict == Verdict.REGRESSED, result.reasons
    assert any("overlap_ratio" in r for r in result.reasons)


def test_batch_invariant_moe_fix_reaches_the_float32_floor(tmp_path: Path) -> None:
    """The batch gap measured here; the time constraint (<= 1.3x) on recorded times."""
    result = replayed(
        tmp_path, "batch-invariant-moe", "reference.patch", "moe-reference", ("time_ms",)
    )
    assert result.verdict == Verdict.IMPROVED, result.reasons
    perf = result.evidence.performance
    assert perf is not None
    assert perf.baseline_median > 1e-3, "baseline should differ across batch sizes"
    assert max(perf.candidate_samples) <= 2e-6  # at the float32 floor (harness.FLOAT32_FLOOR)


def test_batch_invariant_moe_fp64_experts_show_no_improvement() -> None:
    result = experiment("batch-invariant-moe", "wrong_fix.patch")
    assert result.verdict in (Verdict.NO_CHANGE, Verdict.REGRESSED), result.reasons


def test_decode_split_norm_knob_search_helps_less_than_the_fix(tmp_path: Path) -> None:
    """Step times as recorded (1.54x; the real margin: bench_verdict_margins.py
    split-norm-knobs, 8 runs at load 1.8: 1.57-1.74x). A false INCORRECT (float64 rule, measured
    here): about 2e-7 per run at the task's f64_floor (its task.toml says how)."""
    from infra_agent.tasks.patch import knob_patch

    knobs = knob_patch({"num_splits": 2, "block_size": 1024}, author="test", rationale="knobs")
    result = replayed(tmp_path, "decode-split-norm", knobs, "split-norm-knobs")
    assert result.verdict == Verdict.IMPROVED, result.reasons
    perf = result.evidence.performance
    assert perf is not None
    # Two splits still compute the normalization pass twice more than the fix does.
    print(
        f"knob-only speedup {perf.speedup:.2f}x (the reference fix reaches ~2.5x at default knobs)"
    )


KV_SKIP_THE_WAIT = (
    "diff --git a/engine.py b/engine.py\n--- a/engine.py\n+++ b/engine.py\n"
    "@@ -31,8 +31,6 @@ class Engine:\n"
    "             self.worker.submit(step, pages)\n"
    "         for _layer in range(self.moe_layers):\n"
    "             intranode_dispatch(self.dispatch_wait_us)\n"
    "-        if transfer:\n"
    "-            self.worker.wait()\n"
    " \n"
    "     def close(self) -> None:\n"
    "         self.worker.close()\n"
)


def test_kv_transfer_gil_skipping_the_per_step_wait_is_incorrect() -> None:
    """Judged IMPROVED 1.065x with 'correctness pass' before the task declared its invariant.
    Deterministic: with the GIL held through dispatch, the transfer thread can copy at most one
    chunk before the step returns, and each step ships three (4 ms apart)."""
    from infra_agent.tasks.patch import parse_diff

    t = find_task("kv-transfer-gil")
    result = run_experiment(t, parse_diff(KV_SKIP_THE_WAIT)).result
    assert result.verdict == Verdict.INCORRECT, result.render()
    assert "invariant 'transfer-before-return'" in result.reasons[0], result.reasons
    seen = result.evidence.extra["invariants"]["transfer-before-return"]  # type: ignore[index]
    assert seen["baseline"] == "held" and seen["candidate"].startswith("broken: 6 of 6 steps")
