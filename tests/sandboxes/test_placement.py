"""`ConfinedProcesses.placed_on` holds every thread of a command on one CPU for a block and gives
each its own CPU set back after it (the serving harness starts both runs of a pair on the same
core this way). Asserts the kernel's affinity masks, not where or how fast anything ran."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from infra_agent.sandboxes.confined import ConfinedProcesses, kill
from infra_agent.sandboxes.proctree import descendants, threads

# A parent with a second thread and a child of its own: every thread of the tree is moved.
COMMAND = (
    "import subprocess, sys, threading, time; "
    "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start(); "
    "subprocess.Popen(['sleep', '3600']); sys.stdout.write('up\\n'); sys.stdout.flush(); "
    "time.sleep(3600)"
)


def _masks(group: ConfinedProcesses) -> dict[int, set[int]]:
    return {t: os.sched_getaffinity(t) for p in group.processes() for t in threads(p)}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_every_thread_is_held_on_the_cpu_then_given_its_set_back() -> None:
    proc = subprocess.Popen([sys.executable, "-c", COMMAND], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        group = ConfinedProcesses(proc, None, wrappers=0, owner="test")
        before = _masks(group)
        assert len(before) >= 3  # main thread, its sleeper, the child
        cpu = max(os.sched_getaffinity(0))
        with group.placed_on(cpu) as moved:
            assert moved
            assert all(mask == {cpu} for mask in _masks(group).values())
        assert _masks(group) == before
        with group.placed_on(-1) as moved:  # no such CPU: nothing moves, and it says so
            assert not moved
            assert _masks(group) == before
    finally:
        for pid in descendants(proc.pid):
            kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
