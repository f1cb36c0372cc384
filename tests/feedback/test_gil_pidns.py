"""A process in a pid namespace of its own (as a confined SGLang server is): py-spy reads its
threads by the namespace's ids and so calls every thread active (a watchdog asleep in
time.sleep was a third of every server profile). The kernel's thread states, looked up by the
same ids, put it right: a dump marks the sleeper idle, and a profile leaves its samples out."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra_agent.feedback.gil.pyspy import dump_once, find_py_spy
from infra_agent.feedback.gil.threads import kernel_threads, own_pid_namespace
from infra_agent.feedback.pyprofile import profile_pid

SCRIPT = """
import threading, time

def sleeper():
    while True:
        time.sleep(60)  # asleep the whole test: never runnable

threading.Thread(target=sleeper, name="sleeper", daemon=True).start()
print("up", flush=True)
deadline = time.time() + 120
while time.time() < deadline:
    sum(i * i for i in range(1000))
"""


@pytest.fixture
def namespaced(tmp_path: Path) -> Iterator[int]:
    """The pid (host's) of a Python process in a new pid namespace: a busy main thread and a
    sleeping one."""
    unshare = shutil.which("unshare")
    try:
        find_py_spy()
    except Exception as exc:  # noqa: BLE001 - skip without py-spy
        pytest.skip(str(exc))
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a pid namespace")
    script = tmp_path / "two_threads.py"
    script.write_text(SCRIPT)
    argv = [unshare, "--pid", "--fork", "--mount-proc", sys.executable, str(script)]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        up = proc.stdout.readline()
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        if up != b"up\n" or not pids:
            pytest.skip("cannot make a pid namespace here")
        pid = int(pids[0])
        deadline = time.monotonic() + 30  # the sleeper asleep (a loaded machine runs it late)
        while time.monotonic() < deadline:
            if any(t.state == "S" for tid, t in kernel_threads(pid).items() if tid != 1):
                break
            time.sleep(0.05)
        yield pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_kernel_threads_are_keyed_by_the_ids_the_process_sees(namespaced: int) -> None:
    assert own_pid_namespace(namespaced) and not own_pid_namespace(os.getpid())
    threads = kernel_threads(namespaced)
    assert 1 in threads  # the namespace's first process: its main thread is 1 inside
    assert threads[1].host_tid == namespaced
    assert {t.name for t in threads.values()} >= {"python3", "sleeper"} or len(threads) == 2


def test_a_dump_marks_the_sleeping_thread_idle(namespaced: int) -> None:
    threads = {t.thread_name: t for t in dump_once(namespaced, nonblocking=True)}
    assert threads["sleeper"].active is False
    assert threads["sleeper"].thread_id in kernel_threads(namespaced)


def test_a_profile_leaves_the_sleeping_threads_samples_out(namespaced: int) -> None:
    profile = profile_pid(namespaced, duration_s=2.0, rate=50)
    [label] = profile.asleep
    assert label.endswith(": sleeper") and profile.asleep[label] > 0
    assert all("sleeper" not in stack.split(";", 1)[0] for stack in profile.stacks)
    assert profile.samples == sum(profile.stacks.values()) > 0
