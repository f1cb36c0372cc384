"""GIL tracer: py-spy on a real two-thread program, classification rules, in-process fallback."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra_agent.feedback.gil import (
    Frame,
    InProcessSampler,
    ThreadSample,
    analyze,
    classify,
    dump_once,
    trace_command,
)
from infra_agent.feedback.gil.pyspy import PySpyUnavailable

PROGRAM = """
import threading, time

def spin_in_python():
    x = 0
    while True:
        for i in range(10000):
            x += i * i

def io_worker():
    while True:
        time.sleep(0.0005)  # releases the GIL, then must take it back from the spinner

threading.Thread(target=spin_in_python, name="spinner", daemon=True).start()
threading.Thread(target=io_worker, name="io", daemon=True).start()
time.sleep(120)
"""


def _py_spy_can_attach() -> str | None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        dump_once(proc.pid, native=False)
        return None
    except PySpyUnavailable as exc:
        return str(exc)
    finally:
        proc.kill()
        proc.wait()


def test_names_the_thread_and_function_holding_the_gil(tmp_path: Path) -> None:
    why = _py_spy_can_attach()
    if why is not None:
        pytest.skip(f"py-spy cannot attach here: {why}")
    script = tmp_path / "two_threads.py"
    script.write_text(PROGRAM)
    report = trace_command([str(script)], duration_s=3.0, startup_s=0.5, interval_s=0.1)
    assert report.gil_visible and report.snapshots >= 3
    blame = report.blame[0]
    assert blame.waiter == "io"
    assert blame.evidence[0].holder == "spinner"
    assert blame.evidence[0].python_stack[0].startswith("spin_in_python")
    spinner = next(t for t in report.threads if t.thread == "spinner")
    io = next(t for t in report.threads if t.thread == "io")
    assert spinner.holding > io.holding and io.waiting > spinner.waiting
    assert report.render().startswith("thread 'io' waits for the GIL")


def _native(name: str, module: str = "/usr/lib/libc.so.6") -> Frame:
    return Frame(name=name, native=True, module=module)


def test_classification_rules() -> None:
    py = Frame(name="work", file="w.py", line=3)
    libpy = "/usr/lib/libpython3.11.so.1.0"
    s = lambda frames, gil=False, active=True: ThreadSample(  # noqa: E731
        thread_id=1, thread_name="t", active=active, owns_gil=gil, frames=frames
    )
    assert classify(s([py], gil=True)) == "holding"
    assert classify(s([_native("take_gil", libpy), py])) == "waiting"
    # unnamed take_gil: a cond wait straight from the eval loop or a CPython function
    assert classify(s([_native("0x7f00"), _native("pthread_cond_timedwait"), py])) == "waiting"
    assert (
        classify(s([_native("pthread_cond_wait"), _native("time_sleep", libpy), py])) == "waiting"
    )
    # a cond wait inside an extension is not a GIL wait
    ext = _native("std::condition_variable::wait", "/x/libfoo.so")
    assert classify(s([_native("pthread_cond_wait"), ext, py], active=False)) == "idle"
    assert classify(s([_native("clock_nanosleep"), _native("time_sleep", libpy), py])) == "idle"
    assert classify(s([_native("sgemm_kernel", "/x/libblas.so"), py])) == "running"


def test_blame_counts_the_holder_in_the_same_snapshot() -> None:
    spin = Frame(name="spin", file="a.py", line=1)
    wait = [_native("take_gil", "libpython3.11.so"), Frame(name="recv_loop", file="b.py", line=2)]
    snaps = [
        [
            ThreadSample(thread_id=1, thread_name="A", active=True, owns_gil=True, frames=[spin]),
            ThreadSample(thread_id=2, thread_name="B", active=True, owns_gil=False, frames=wait),
        ]
        for _ in range(30)
    ]
    r = analyze(snaps, method="test", duration_s=1.0)
    assert [(b.waiter, b.evidence[0].holder, b.evidence[0].share) for b in r.blame] == [
        ("B", "A", 1.0)
    ]
    assert r.blame[0].evidence[0].python_stack == ["spin (a.py)"]


def test_in_process_fallback_is_marked_blind_to_the_gil() -> None:
    stop = threading.Event()

    def busy_python() -> None:
        while not stop.is_set():
            sum(i * i for i in range(1000))

    t = threading.Thread(target=busy_python, name="busy")
    t.start()
    with InProcessSampler(interval_s=0.005) as sampler:
        time.sleep(0.3)
    stop.set()
    t.join()
    r = sampler.report()
    assert not r.gil_visible and r.blame == []
    assert any("cannot see" in w for w in r.warnings)
    busy = next(x for x in r.threads if x.thread == "busy")
    assert busy.running > 0.5 and busy.holding == 0
    assert "NOT visible" in r.render()
