"""GIL tracer: py-spy on real programs (both samplers), the record sampler's parsing and merge,
classification rules, in-process fallback."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from infra_agent.feedback.gil import (
    Frame,
    InProcessSampler,
    ThreadSample,
    analyze,
    classify,
    dump_once,
    trace_command,
    trace_pid,
)
from infra_agent.feedback.gil import record as gil_record
from infra_agent.feedback.gil.holders import HeldGil, merge_holders
from infra_agent.feedback.gil.pyspy import PySpyUnavailable
from infra_agent.feedback.gil.record import held_from_speedscope, snapshots_from_chrometrace
from infra_agent.feedback.gil.trace import NO_NATIVE_IN_PIDNS

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
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # running Python
        dump_once(proc.pid, native=False)
        return None
    except PySpyUnavailable as exc:
        return str(exc)
    finally:
        proc.kill()
        proc.wait()


NATIVE_HOLDER = """
import ctypes, threading, time

_libc = ctypes.PyDLL("libc.so.6")  # PyDLL keeps the GIL during the call

def hold_gil_in_native():
    while True:
        _libc.usleep(2000)

def worker():
    while True:
        time.sleep(0.0002)

threading.Thread(target=worker, name="worker", daemon=True).start()
print("up", flush=True)
hold_gil_in_native()
"""


@pytest.fixture(scope="module")
def py_spy() -> None:
    why = _py_spy_can_attach()
    if why is not None:
        pytest.skip(f"py-spy cannot attach here: {why}")


@pytest.mark.parametrize("sampler", ["record", "dump"])
def test_names_the_thread_and_function_holding_the_gil(
    tmp_path: Path, py_spy: None, sampler: str
) -> None:
    script = tmp_path / "two_threads.py"
    script.write_text(PROGRAM)
    report = trace_command(
        [str(script)], duration_s=3.0, startup_s=0.5, interval_s=0.1, sampler=sampler
    )  # type: ignore[arg-type]
    assert report.gil_visible and report.snapshots >= 3
    assert report.method.startswith(f"py-spy {sampler}")
    blame = report.blame[0]
    assert blame.waiter == "io"
    assert blame.evidence[0].holder == "spinner"
    assert blame.evidence[0].python_stack[0].startswith("spin_in_python")
    spinner = next(t for t in report.threads if t.thread == "spinner")
    io = next(t for t in report.threads if t.thread == "io")
    assert spinner.holding > io.holding and io.waiting > spinner.waiting
    assert report.render().startswith("thread 'io' waits for the GIL")
    assert blame.same_instant == (sampler == "dump")


def test_default_sampler_names_native_code_that_keeps_the_gil(tmp_path: Path, py_spy: None) -> None:
    """The holder sits in a C call (ctypes PyDLL): its stack looks like a sleep, only the
    interpreter's GIL owner (py-spy record --gil) says it holds the GIL."""
    script = tmp_path / "native_holder.py"
    script.write_text(NATIVE_HOLDER)
    report = trace_command([str(script)], duration_s=3.0, startup_s=0.5)
    assert report.method.startswith("py-spy record --native + --gil")
    blame = report.blame[0]
    assert blame.waiter == "worker"
    assert blame.evidence[0].holder == "MainThread"
    assert blame.evidence[0].python_stack[0].startswith("hold_gil_in_native")
    main = next(t for t in report.threads if t.thread == "MainThread")
    assert main.holding > 0.5 and not report.gil_inferred


HASHER = """
import hashlib, threading, time

BUF = b"x" * (1 << 13)  # hashlib releases the GIL while hashing more than 2047 bytes

def hash_big_buffers():
    while True:
        hashlib.sha256(BUF).digest()  # then retakes the GIL inside _hashlib

def spin_in_python():
    x = 0
    while True:
        for i in range(10000):
            x += i * i

threading.Thread(target=hash_big_buffers, name="hasher", daemon=True).start()
threading.Thread(target=spin_in_python, name="spinner", daemon=True).start()
time.sleep(120)
"""


@pytest.mark.long
@pytest.mark.parametrize("sampler", ["record", "dump"])
def test_a_thread_retaking_the_gil_inside_a_c_extension_is_waiting(
    tmp_path: Path, py_spy: None, sampler: str
) -> None:
    """After hashing a big buffer without the GIL, `_hashlib` retakes it from the spinner: py-spy
    shows a timed condition wait called from the extension (it drops take_gil's frames). That is
    a GIL wait, blamed on the spinner, not idle time.

    Long tier: it asserts sampled shares of a thread that is in two states by turns (waiting
    0.33-0.4, running ~0.6; a dump at load 20 got 12 samples, one read idle). In CI the rule
    itself is test_classification_rules (the extension's condition wait is a GIL wait) and the
    blame test_blame_counts_the_holder_in_the_same_snapshot, on fixed stacks."""
    script = tmp_path / "hasher.py"
    script.write_text(HASHER)
    report = trace_command(
        [str(script)], duration_s=3.0, startup_s=0.5, interval_s=0.1, sampler=sampler
    )  # type: ignore[arg-type]
    hasher = next(t for t in report.threads if t.thread == "hasher")
    assert hasher.waiting > 0.2 and hasher.waiting > hasher.idle, report.render()
    # (the spinner may wait too, while the hasher holds the GIL between hashes)
    blame = next(b for b in report.blame if b.waiter == "hasher")
    # ('nobody' can come first over a trace on a loaded machine, where py-spy skips samples)
    holders = [e.holder for e in blame.evidence if e.holder != "nobody"]
    assert holders[0] == "spinner", report.render()
    assert "thread 'hasher' waits for the GIL" in report.render()
    assert "_hashlib_openssl_sha256 [" in blame.waiting_at[0]  # the extension retaking it
    assert "hash_big_buffers (hasher.py:8)" in blame.waiting_at[0]


REGEX_HOLDER = """
import re, threading, time

def io_worker():
    while True:
        time.sleep(0.0005)

def scan():
    while True:
        re.search(r"(a|aa)*c", "a" * 30)  # backtracks in the regex engine, holding the GIL

threading.Thread(target=io_worker, name="io", daemon=True).start()
threading.Thread(target=scan, name="scanner", daemon=True).start()
time.sleep(120)
"""


def test_names_the_native_frame_where_the_gil_holder_spends_its_time(
    tmp_path: Path, py_spy: None
) -> None:
    """The holder's Python frame is one line calling `re.search`; the time goes to the regex
    engine (`_sre`'s matcher), which the rendering names."""
    script = tmp_path / "regex_holder.py"
    script.write_text(REGEX_HOLDER)
    report = trace_command([str(script)], duration_s=2.0, startup_s=0.5)
    text = report.render()
    assert text.startswith("thread 'io' waits for the GIL"), text
    held = next(e for e in report.blame[0].evidence if e.holder == "scanner")
    assert held.native_top[0].startswith("sre_") and held.python_stack[1].startswith("scan (")
    assert "in sre_" in text and "(regex engine) <- search (__init__.py) <- scan (" in text
    scanner = next(t for t in report.threads if t.thread == "scanner")
    assert scanner.top_native and scanner.top_native[0].startswith("sre_")
    assert any(ln.startswith("  scanner:") and "native sre_" in ln for ln in text.splitlines())


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
    # an extension retaking the GIL after its work (py-spy drops take_gil's own frames)
    hashlib_so = "/py/lib-dynload/_hashlib.cpython-311-x86_64-linux-gnu.so"
    retake = [_native("pthread_cond_timedwait"), _native("py_evp_fromname", hashlib_so), py]
    assert classify(s(retake, active=False)) == "waiting"
    from_source = [_native("pthread_cond_timedwait"), _native("EVP_hash", "/b/_hashopenssl.c"), py]
    assert classify(s(from_source, active=False)) == "waiting"
    # a timed wait in a library under the extension is that library's own wait
    pool = [_native("pthread_cond_timedwait"), _native("pool_get", "/x/libpool.so"),
            _native("py_get", hashlib_so), py]  # fmt: skip
    assert classify(s(pool, active=False)) == "idle"


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


def test_without_waits_the_culprit_is_where_the_holder_held_the_gil() -> None:
    """No native frames (non-pausing dumps): no waits, so the culprit is the top holder, at the
    function it held the GIL in, not the one it spent most samples in (a condition wait)."""
    dispatch = Frame(name="intranode_dispatch", file="/w/dispatch.py", line=19)
    wait = Frame(name="Condition.wait", file="/usr/lib/threading.py", line=327)
    main = [(True, dispatch)] * 4 + [(False, wait)] * 6
    snaps = [
        [
            ThreadSample(thread_id=1, thread_name="MainThread", active=True, owns_gil=gil,
                         frames=[frame]),
            ThreadSample(thread_id=2, thread_name="kv", active=True, owns_gil=False, frames=[wait]),
        ]
        for gil, frame in main
    ]  # fmt: skip
    report = analyze(snaps, method="test", duration_s=1.0)
    main_row = next(t for t in report.threads if t.thread == "MainThread")
    assert main_row.top_functions[0].startswith("Condition.wait")
    assert main_row.holding_in == ["intranode_dispatch (dispatch.py) 100%"]
    culprit = report.culprit()
    assert (culprit.thread, culprit.function) == ("MainThread", "dispatch.py:intranode_dispatch")


def test_in_process_fallback_is_marked_blind_to_the_gil() -> None:
    stop = threading.Event()

    def busy_python() -> None:
        while not stop.is_set():
            sum(i * i for i in range(1000))

    t = threading.Thread(target=busy_python, name="busy")
    t.start()
    with InProcessSampler(interval_s=0.005) as sampler:
        while len(sampler.snapshots) < 30:  # as many samples as the test needs, however slow
            time.sleep(0.01)
    stop.set()
    t.join()
    r = sampler.report()
    assert not r.gil_visible and r.blame == []
    assert any("cannot see" in w for w in r.warnings)
    busy = next(x for x in r.threads if x.thread == "busy")
    assert busy.running > 0.5 and busy.holding == 0
    assert "NOT visible" in r.render()


def test_default_sampler_uses_dumps_in_another_pid_namespace(
    tmp_path: Path, py_spy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In another pid namespace (as in the local sandbox and a confined server) py-spy reads
    threads by the namespace's ids, so `record --native` cannot unwind them (UNW_EBADREG, retried
    for seconds): the default sampler does not start it there, and uses non-pausing dumps,
    which still name the GIL holder, and say why."""
    script = tmp_path / "native_holder.py"
    script.write_text(NATIVE_HOLDER)
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare")
    argv = [unshare, "--pid", "--fork", "--mount-proc", sys.executable, str(script)]
    proc = subprocess.Popen(
        argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        up = proc.stdout.readline()  # the script runs its threads (or unshare failed: EOF)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        if up != b"up\n" or not pids:
            pytest.skip(f"cannot make a pid namespace here: {proc.stderr.read()!r}")  # type: ignore[union-attr]
        recorders: list[Any] = []

        class SeenRecorder(gil_record._Recorder):
            def __init__(self, cmd: list[str]) -> None:
                super().__init__(cmd)
                recorders.append(self)

        monkeypatch.setattr(gil_record, "_Recorder", SeenRecorder)
        report = trace_pid(int(pids[0]), duration_s=1.0, interval_s=0.1)
        assert recorders == []  # no `py-spy record` was started
        assert NO_NATIVE_IN_PIDNS in report.warnings
        assert report.method.startswith("py-spy dump --json,")
        main = next(t for t in report.threads if t.thread == "MainThread")
        assert main.holding > 0.5
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _event(ph: str, tid: int, ts_us: int, name: str, file: str = "", line: int = 0) -> dict:
    return {"ph": ph, "tid": tid, "ts": ts_us, "name": name,
            "args": {"filename": file, "line": line}}  # fmt: skip


def test_snapshots_from_chrometrace_rebuild_each_instant() -> None:
    """Begin/end events at 10 samples/s: thread A spins in Python (holder inferred), thread B
    sleeps 0.2 s, then waits for the GIL (a cond wait called from the interpreter)."""
    libc, libpy = "/usr/lib/libc.so.6", "/usr/lib/libpython3.11.so.1.0"
    events = [
        _event("B", 1, 0, "thread (101): A"),
        _event("B", 1, 0, "spin", "a.py", 3),
        _event("B", 2, 0, "thread (102): B"),
        _event("B", 2, 0, "loop", "b.py", 7),
        _event("B", 2, 0, "time_sleep", libpy),
        _event("B", 2, 0, "clock_nanosleep", libc),
        _event("E", 2, 200_000, "clock_nanosleep", libc),
        _event("B", 2, 200_000, "pthread_cond_timedwait", libc),
        *(_event("E", 2, 400_000, n) for n in ("pthread_cond_timedwait", "time_sleep", "loop")),
        _event("E", 2, 400_000, "thread (102): B"),
        *(_event("E", 1, 400_000, n) for n in ("spin", "thread (101): A")),
    ]
    snaps = snapshots_from_chrometrace(events, rate=10)
    assert len(snaps) == 4
    states = [{s.thread_name: classify(s) for s in snap} for snap in snaps]
    assert [st["B"] for st in states] == ["idle", "idle", "waiting", "waiting"]
    assert all(st["A"] == "holding" for st in states)
    assert {s.thread_id for s in snaps[0]} == {101, 102}
    assert snaps[2][1].frames[0].native and snaps[2][1].frames[2].name == "loop"


def test_exact_holders_replace_inferred_ones() -> None:
    """The native stacks show the holder as idle in a C call; the --gil recorder says it held
    the GIL: holding share and blame come from it."""
    doc = {
        "shared": {"frames": [{"name": "thread (7): MainThread", "file": ""},
                              {"name": "dispatch", "file": "/w/dispatch.py", "line": 19},
                              {"name": "main", "file": "/w/engine.py", "line": 5}]},
        "profiles": [{"samples": [[0, 2, 1]] * 8}],
    }  # fmt: skip
    held = held_from_speedscope(doc)
    assert held == [
        HeldGil(
            thread_id=7,
            thread="MainThread",
            python_stack=["dispatch (dispatch.py)", "main (engine.py)"],
            samples=8,
        )
    ]
    sleeping = [_native("clock_nanosleep"), Frame(name="dispatch", file="/w/dispatch.py", line=19)]
    waiting = [_native("take_gil", "libpython3.11.so"), Frame(name="ship", file="kv.py", line=2)]
    snaps = [
        [
            ThreadSample(thread_id=7, thread_name="MainThread", active=True, owns_gil=False,
                         frames=sleeping),
            ThreadSample(thread_id=8, thread_name="kv", active=True, owns_gil=False,
                         frames=waiting),
        ]
        for _ in range(10)
    ]  # fmt: skip
    report = analyze(snaps, method="test", duration_s=1.0)
    assert report.blame[0].evidence[0].holder == "nobody"
    merge_holders(report, held, ticks=10)
    main = next(t for t in report.threads if t.thread == "MainThread")
    assert (main.holding, main.idle) == (pytest.approx(0.8), pytest.approx(0.2))
    kv = next(t for t in report.threads if t.thread == "kv")
    assert (kv.waiting, kv.holding) == (1.0, 0.0)
    ev = report.blame[0].evidence
    assert [(e.holder, round(e.share, 2)) for e in ev] == [("MainThread", 0.8), ("nobody", 0.2)]
    assert ev[0].python_stack[0] == "dispatch (dispatch.py)"
    assert "over the trace 'MainThread' held it 80%" in report.render()


def test_a_nonblocking_dump_caught_mid_update_is_skipped_but_mostly_failing_dumps_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from infra_agent.feedback.gil import pyspy

    calls: list[int] = []

    def flaky(pid: int, *, native: bool, nonblocking: bool) -> list[pyspy.ThreadSample]:
        calls.append(pid)
        if len(calls) % 3 == 2:  # every third dump catches a thread mid-update
            raise pyspy.PySpyUnavailable("py-spy cannot sample pid 1: Failed to get stack traces")
        return []

    monkeypatch.setattr(pyspy, "dump_once", flaky)
    snapshots, _ = pyspy.sample_pid(
        os.getpid(), duration_s=60, interval_s=0, max_snapshots=6, nonblocking=True
    )
    assert len(snapshots) == 6 and len(calls) == 9  # three torn reads skipped
    # Two torn reads in a row at the start (seen on a loaded machine) are skipped too.
    calls.clear()

    def torn_start(pid: int, *, native: bool, nonblocking: bool) -> list[pyspy.ThreadSample]:
        calls.append(pid)
        if len(calls) <= 2:
            raise pyspy.PySpyUnavailable("py-spy cannot sample pid 1: Failed to get stack traces")
        return []

    monkeypatch.setattr(pyspy, "dump_once", torn_start)
    snapshots, _ = pyspy.sample_pid(
        os.getpid(), duration_s=60, interval_s=0, max_snapshots=4, nonblocking=True
    )
    assert len(snapshots) == 4 and len(calls) == 6
    # Torn reads are tried again at once: eleven in a row still give a snapshot, twelve do not.
    for torn, raises in ((pyspy.TORN_RETRIES - 1, False), (pyspy.TORN_RETRIES, True)):
        calls.clear()

        def torn_run(
            pid: int, *, native: bool, nonblocking: bool, n: int = torn
        ) -> list[pyspy.ThreadSample]:
            calls.append(pid)
            if len(calls) <= n:
                raise pyspy.PySpyUnavailable(
                    "py-spy cannot sample pid 1: Failed to get stack traces"
                )
            return []

        monkeypatch.setattr(pyspy, "dump_once", torn_run)
        if raises:
            with pytest.raises(pyspy.PySpyUnavailable, match="Failed to get stack traces"):
                pyspy.sample_pid(
                    os.getpid(), duration_s=60, interval_s=0, max_snapshots=2, nonblocking=True
                )
        else:
            snapshots, _ = pyspy.sample_pid(
                os.getpid(), duration_s=60, interval_s=0, max_snapshots=2, nonblocking=True
            )
            assert len(snapshots) == 2
    monkeypatch.setattr(pyspy, "dump_once", flaky)
    # A pausing dump that fails is not skipped: it is the target refusing, not a torn read.
    calls.clear()
    with pytest.raises(pyspy.PySpyUnavailable):
        pyspy.sample_pid(os.getpid(), duration_s=60, interval_s=0, max_snapshots=6)

    def broken(pid: int, *, native: bool, nonblocking: bool) -> list[pyspy.ThreadSample]:
        raise pyspy.PySpyUnavailable("py-spy cannot sample pid 1: Permission denied")

    monkeypatch.setattr(pyspy, "dump_once", broken)
    with pytest.raises(pyspy.PySpyUnavailable, match="Permission denied"):
        pyspy.sample_pid(os.getpid(), duration_s=60, interval_s=0, nonblocking=True)
