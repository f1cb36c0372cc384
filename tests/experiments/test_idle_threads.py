"""Threads started by candidate code (at import, warm-up or later): an idle compute pool grown by
a knob is tolerated, a thread that keeps computing after its call returned is not (measured
through /proc, not by name)."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from infra_agent.experiments import run_experiment
from infra_agent.experiments.worker import RpcWorker
from infra_agent.sandboxes import SandboxSpec, create_sandbox
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.harness import CandidateFailure
from infra_agent.tasks.patch import knob_patch
from infra_agent.tasks.registry import find_task

POOL = """
import os
import threading
import time

import torch


def grow(n):
    torch.set_num_threads(n)  # the intra-op pool starts its threads lazily, at the next big op
    x = torch.randn(384, 384)
    for _ in range(8):
        x = torch.tanh(x @ x / 384)
    return float(x.sum())


def _spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def burn(seconds):
    threading.Thread(target=_spin, args=(seconds,), daemon=True).start()
    return 1


def burn_when_told(go, spun, seconds):
    # A thread asleep in the kernel until the test opens the FIFO `go`, then computing for
    # `seconds`; it creates `spun` once it has used 50 ms of CPU (17x the idle limit).

    def run():
        with open(go):  # blocks until the test opens the other end
            pass
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if time.thread_time() > 0.05 and not os.path.exists(spun):
                open(spun, "w").close()

    threading.Thread(target=run, daemon=True).start()
    return 1


def ok():
    return 1
"""

BURN_AFTER_RETURN = """
import threading
import time

import torch


def _finish(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # work the timed call did not pay for
        pass


def axpy(a, xs, ys):
    threading.Thread(target=_finish, args=(20.0,), daemon=True).start()
    return [a * x + y for x, y in zip(xs, ys)]
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory):  # -> Iterator[Sandbox]
    ws = tmp_path_factory.mktemp("ws")
    (ws / "pool.py").write_text(POOL)
    with create_sandbox("local", ws, SandboxSpec()) as sb:
        yield sb


@pytest.fixture
def worker(sandbox):  # -> Iterator[RpcWorker]: warm with a one-thread pool
    # the guard is on between calls too: threads may write only in the workspace, as in a task
    w = RpcWorker(
        sandbox, call_timeout_s=30, preload=["torch"], guard={"writable": [str(sandbox.root)]}
    )
    w.call("pool:grow", 1)
    yield w
    w.close()


def test_idle_pool_threads_grown_after_warm_up_are_tolerated(worker: RpcWorker) -> None:
    warm = set(worker.watch.start_tids or ())
    for _ in range(3):
        worker.call("pool:grow", 3)
    assert worker.watch.tolerated, "set_num_threads(3) should have started pool threads"
    assert not worker.watch.tolerated & warm
    assert worker.call("pool:ok") == 1


def test_thread_burning_cpu_after_return_is_a_violation(worker: RpcWorker) -> None:
    with pytest.raises(CandidateFailure, match="background thread") as info:
        worker.call("pool:burn", 30.0)
        worker.call("pool:ok")  # a busy machine may starve it in the window: caught here then
    assert info.value.kind == "violation"


def test_thread_idle_in_the_window_then_working_is_a_violation(worker: RpcWorker) -> None:
    go, spun = worker.sandbox.root / "go", worker.sandbox.root / "spun"
    os.mkfifo(go)
    worker.call("pool:burn_when_told", str(go), str(spun), 30.0)  # asleep while watched
    _open_fifo_for_writing(go).close()  # wakes it up
    deadline = time.monotonic() + 120  # bounds a broken worker only
    while not spun.exists():
        assert time.monotonic() < deadline, "the thread never ran"
        time.sleep(0.01)
    with pytest.raises(CandidateFailure, match="between calls") as info:
        worker.call("pool:ok")
    assert info.value.kind == "violation"


def _open_fifo_for_writing(path: Path, timeout_s: float = 120.0) -> BinaryIO:
    """Open a FIFO once its reader has (the timeout bounds a reader that never comes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return os.fdopen(os.open(path, os.O_WRONLY | os.O_NONBLOCK), "wb")
        except OSError as exc:  # ENXIO: no reader yet
            if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
        time.sleep(0.01)


@pytest.mark.slow
def test_torch_threads_knob_is_not_rejected() -> None:
    """decode-split-norm with threads=2: torch's pool threads start after warm-up; the
    experiment gets a real verdict."""
    task = find_task("decode-split-norm")
    result = run_experiment(task, knob_patch({"threads": 2})).result
    assert result.verdict not in (Verdict.REJECTED, Verdict.FAILED), result.render()
    assert result.evidence.performance is not None
    # What the leftover-work guard let pass is in the evidence, per arm.
    watch = result.evidence.extra["process_watch"]
    assert set(watch) == {"baseline", "candidate"}  # type: ignore[arg-type]
    assert watch["candidate"]["idle_pool_threads_tolerated"] >= 1  # type: ignore[index]
    assert watch["candidate"]["pool_threads_allowed"] >= 1  # type: ignore[index]


def test_thread_burning_after_return_is_rejected(pytask, make_patch, backend: str) -> None:
    """With torch loaded (so pool threads would be tolerated) and `threads` allowed, a thread
    that keeps computing after its call returned is still caught at run time."""
    task = pytask(allow=["threads"])
    (task.workspace / "uses_torch.py").write_text("import torch\n")  # workers preload torch
    result = run_experiment(
        task, make_patch(task, "kernel.py", BURN_AFTER_RETURN), sandbox=backend
    ).result
    assert result.verdict == Verdict.REJECTED, result.render()
    assert "background thread" in " ".join(result.reasons)


# -- threads born before the first call: at import, and a pool started at warm-up ------------

SLOW_AXPY = (Path(__file__).parent / "pytask" / "workspace" / "kernel.py").read_text()
"""The test task's own kernel: the cheats below do exactly the baseline's work."""

SPIN_FROM_IMPORT = (
    """
import threading


def _spin():
    while True:  # burns a core while the other arm is measured
        pass


threading.Thread(target=_spin, daemon=True).start()
"""
    + SLOW_AXPY
)

BURSTS_FROM_IMPORT = (
    """
import threading
import time

import torch


def _bursts():
    while True:
        time.sleep(0.02)  # asleep whenever it is looked at right after a call...
        end = time.monotonic() + 0.1
        while time.monotonic() < end:  # ...and busy in between
            pass


threading.Thread(target=_bursts, daemon=True).start()
"""
    + SLOW_AXPY
)


@pytest.mark.parametrize("source", [SPIN_FROM_IMPORT, BURSTS_FROM_IMPORT], ids=["spin", "bursts"])
def test_threads_started_at_import_are_watched(pytask, make_patch, backend: str, source) -> None:
    """Judged IMPROVED 2.44x on docker when the watch started after warm-up: a thread born at
    import burned CPU while the baseline was measured. The watch now starts before any candidate
    code is imported. Deterministic: the spinner is always runnable (never settles); the bursts
    run 100 ms of every 120 ms, so the CPU between calls (or at return) exceeds the 3 ms limit in
    the first gaps already, whatever the machine's load."""
    task = pytask(allow=["threads"])
    (task.workspace / "uses_torch.py").write_text("import torch\n")  # pool threads tolerated
    result = run_experiment(task, make_patch(task, "kernel.py", source), sandbox=backend).result
    assert result.verdict == Verdict.REJECTED, result.render()
    reasons = " ".join(result.reasons)
    assert "background thread" in reasons or "thread(s) running" in reasons, reasons
    assert result.evidence.stage_reached in ("prepare", "correctness")


def test_background_work_is_allowed_when_the_task_says_so(pytask, make_patch) -> None:
    """`allow = ["background"]`: threads may outlive calls and work between them, so the same
    spinner is measured instead of rejected (the task owns that choice)."""
    task = pytask(allow=["threads", "background"])
    result = run_experiment(task, make_patch(task, "kernel.py", SPIN_FROM_IMPORT)).result
    assert result.verdict not in (Verdict.REJECTED, Verdict.FAILED), result.render()
    assert result.evidence.extra["process_watch"]["candidate"]["background_allowed"] is True  # type: ignore[index]


# -- settling is judged on CPU used, not on wall time (recorded /proc marks replayed) -----------


def _marks(steps: list[tuple[int, bool]]):  # type: ignore[no-untyped-def]
    """CpuMark.take for thread 7: each call the next (CPU ns so far, runnable), the last repeated."""
    from infra_agent.sandboxes.procwatch import CpuMark

    calls = iter(steps)
    last = steps[-1]

    def take(_pid: int) -> CpuMark:
        nonlocal last
        last = next(calls, last)
        return CpuMark({7: last[0]}, 0, 0, frozenset({7}) if last[1] else frozenset())

    return take


@pytest.mark.parametrize(
    ("steps", "busy"),
    [
        # runnable with no CPU for 40 polls (a loaded machine's run queue), then asleep
        ([(0, True)] * 41 + [(2_000_000, True), (2_000_000, False)], None),
        # runnable and never run until the wait is over: tolerated, measured up to the next call
        ([(0, True)], None),
        # 10 ms of CPU per poll: past the 30 ms spin allowance whatever the wall time
        ([(n * 10_000_000, True) for n in range(10)], "while settling after"),
        # still using CPU when the wait is over, 20 us a poll: under the allowance throughout
        ([(n * 20_000, True) for n in range(1000)], "s after"),
    ],
    ids=["starved-then-asleep", "starved-throughout", "spinning-past-the-allowance", "trickling"],
)
def test_a_thread_waiting_for_a_cpu_is_not_taken_for_one_at_work(
    monkeypatch: pytest.MonkeyPatch, steps: list[tuple[int, bool]], busy: str | None
) -> None:
    from infra_agent.sandboxes import procwatch

    monkeypatch.setattr(procwatch.CpuMark, "take", staticmethod(_marks(steps)))
    monkeypatch.setattr(procwatch, "SETTLE_S", 0.3)
    monkeypatch.setattr(procwatch, "POLL_S", 0.001)
    watch = procwatch.ProcessWatch(0, "x")
    found = watch._settle(1, {7})
    if busy is None:
        assert found is None and watch.tolerated == {7}
    else:
        assert found is not None and busy in found and "background thread" in found
