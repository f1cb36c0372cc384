"""run_bench on real code: a target doing 20% more work is SLOWER, identical work is SAME.

The engine's decisions are tested on targets that run their code for real but report a work
count as their time (`Counted`), so they do not hang on the machine's load; how the engine does on
the real clock (its A/A false-positive rate, its detection of 3% and 5% effects) is measured by
benchmarks/bench_feedback_bench.py."""

import random
import sys
from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.feedback.bench import CommandTarget, WorkerTarget, run_bench


def _work(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


class Counted:
    """Runs `_work(n)` for real and reports its work as its time: n loop steps at 50 ns each,
    times a fixed-seed noise of 2% (sd) per sample. Warm-up calls (one iteration) report the
    bare count and draw no noise, so how many the real clock allows changes nothing."""

    timer = "work counter"

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.noise = random.Random(seed)

    def sample(self, iterations: int) -> float:
        for _ in range(iterations):
            _work(self.n)
        base = self.n * 50e-9
        return base if iterations == 1 else base * (1 + self.noise.gauss(0, 0.02))

    def close(self) -> None:
        pass


def test_detects_a_20_percent_slower_variant() -> None:
    r = run_bench(Counted(20_000, seed=1), Counted(24_000, seed=2), min_sample_s=0.01, budget_s=600)
    assert r.comparison.verdict == "SLOWER"
    assert r.comparison.ci_high < 0.95
    assert r.baseline_samples_s and len(r.baseline_samples_s) == len(r.candidate_samples_s)
    assert "SLOWER" in r.render()


def test_identical_code_is_same() -> None:
    r = run_bench(
        Counted(20_000, seed=1),
        Counted(20_000, seed=2),
        min_sample_s=0.01,
        budget_s=600,
        equivalence=0.05,  # identical work: the whole 95% interval within ±5%
    )
    assert r.comparison.verdict == "SAME", r.render()
    assert 0.95 <= r.comparison.ci_low <= r.comparison.ci_high <= 1.05


def test_plain_callables_are_timed_on_the_clock_asked_for() -> None:
    """A plain callable is a CallableTarget on `clock` (its numbers are the machine's)."""
    r = run_bench(lambda: _work(2000), lambda: _work(2000), clock="cpu", budget_s=1,
                  min_samples=3, max_samples=4)  # fmt: skip
    assert r.timer == "thread_time_ns" and len(r.baseline_samples_s) >= 3


def test_command_and_worker_targets(tmp_path: Path) -> None:
    code = tmp_path / "kernels.py"
    code.write_text("def fast():\n    sum(range(1000))\n")
    worker = WorkerTarget(f"{code}:fast")
    command = CommandTarget(f"{sys.executable} -c pass")
    r = run_bench(worker, command, min_sample_s=0.001, budget_s=3, min_samples=4, max_samples=8)
    assert r.timer == "worker:perf_counter_ns"
    # A fresh interpreter per call is much slower than summing a range in a warm worker.
    assert r.comparison.verdict == "SLOWER"
    assert worker.proc.poll() is not None  # closed on return
    assert r.counters_unavailable is None


def test_failing_command_and_bad_spec_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="exited with 3"):
        CommandTarget("exit 3").sample(1)
    with pytest.raises(UserError, match="no attribute"):
        code = tmp_path / "k.py"
        code.write_text("x = 1\n")
        WorkerTarget(f"{code}:missing")


@pytest.mark.skipif(__import__("shutil").which("ncu") is not None, reason="ncu present")
def test_counters_say_unavailable_without_ncu() -> None:
    r = run_bench(
        lambda: None, lambda: None, budget_s=1, min_samples=4, max_samples=4, with_counters=True
    )
    assert r.counters is None
    assert r.counters_unavailable is not None
    assert r.counters_unavailable.startswith("unavailable: ncu")


def test_parse_ncu_csv_aggregates_per_kernel() -> None:
    from infra_agent.feedback.bench.counters import parse_ncu_csv

    text = (
        "==PROF== Connected\n"
        '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"\n'
        '"0","gemm","gpu__time_duration.sum","nsecond","1,000"\n'
        '"0","gemm","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","80"\n'
        '"1","gemm","gpu__time_duration.sum","nsecond","3000"\n'
        '"1","gemm","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","60"\n'
    )
    (k,) = parse_ncu_csv(text)
    assert k.launches == 2
    assert k.metrics["gpu__time_duration.sum"] == 4000
    assert k.metrics["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == 70
