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
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        {work}
    print(repr((time.perf_counter_ns() - t0) / 1e9 / n), flush=True)
"""


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen]]:
    procs: list[subprocess.Popen] = []

    def start(work: str, before: str = "") -> subprocess.Popen:
        code = WORKER.format(work=work, before=before)
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
    fast = _target(spawn("sum(range(2000))"), "fast")
    slow = _target(spawn("sum(range(6000))"), "slow")
    result = run_bench(fast, slow, budget_s=3, min_sample_s=0.002)
    # Three times the work: the verdict, not the ratio's size, is the engine's behaviour (beside a
    # loaded sibling worker a suite run read 0.73x, 95% CI 0.42-0.87: still SLOWER).
    assert result.comparison.verdict == "SLOWER" and result.comparison.ci_high < 1.0
    assert len(result.warmup_calls) == 2 and min(result.warmup_calls) > 1  # 50 ms of calls
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
