"""PipeTarget: the bench engine timing processes started elsewhere (as the microbench tool's
sandboxed arms), with warm-up and calibration recorded, and every failure named in one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from infra_agent.errors import UserError
from infra_agent.feedback.bench import PipeTarget, run_bench

WORKER = """
import sys, time
{before}
print("ready", flush=True)
for k, line in enumerate(sys.stdin):
    n = int(line)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        {work}
    print(repr({report}), flush=True)
"""
CLOCKED = "(time.perf_counter_ns() - t0) / 1e9 / n"
"""What a worker reports by default: seconds per iteration on its clock."""


def counted(units: int) -> str:
    """A report of work done instead of time: `units` at 100 ns each, times a fixed +-2% cycle
    (one-iteration calls, the warm-up's, report the bare count), so the engine's verdict and
    calibration do not hang on the machine's load."""
    return f"{units} * 1e-7 * (1 if n == 1 else 1 + 0.01 * (k % 5 - 2))"


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen]]:
    procs: list[subprocess.Popen] = []

    def start(work: str, before: str = "", report: str = CLOCKED) -> subprocess.Popen:
        code = WORKER.format(work=work, before=before, report=report)
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _target(proc: subprocess.Popen, name: str, **kw: float) -> PipeTarget:
    return PipeTarget(
        proc.stdin,
        proc.stdout,
        name=name,
        describe_exit=lambda: proc.stderr.read().decode().strip().splitlines()[-1],
        **kw,
    )


def test_the_engine_warms_up_calibrates_and_finds_the_slower_process(
    spawn: Callable[..., subprocess.Popen],
) -> None:
    # Three times the work, reported as a work count (a suite run beside a loaded sibling worker
    # read the clocked ratio 0.73x, 95% CI 0.42-0.87): the verdict and the calibration are the
    # engine's behaviour on what the processes report; the real clock's numbers are
    # benchmarks/bench_feedback_bench.py's.
    fast = _target(spawn("sum(range(2000))", report=counted(2000)), "fast")
    slow = _target(spawn("sum(range(6000))", report=counted(6000)), "slow")
    result = run_bench(fast, slow, budget_s=600, min_sample_s=0.002)
    assert result.comparison.verdict == "SLOWER" and result.comparison.ci_high < 0.4
    assert len(result.warmup_calls) == 2 and min(result.warmup_calls) >= 1  # 50 ms of calls
    assert result.calibration_steps[0] == 1 and result.iterations_per_sample > 1
    assert result.calibration_steps[-1] == result.iterations_per_sample
    assert result.timer == "sandbox:perf_counter_ns"


def test_a_hung_or_dead_process_is_named_in_one_line(
    spawn: Callable[..., subprocess.Popen],
) -> None:
    hung = _target(spawn("time.sleep(5)"), "the baseline arm", timeout_s=0.5)
    with pytest.raises(UserError, match="the baseline arm took more than 0.5 s for 1 calls"):
        hung.sample(1)
    with pytest.raises(UserError, match=r"the candidate arm exited: ZeroDivisionError"):
        _target(spawn("pass", before="1 / 0"), "the candidate arm")
