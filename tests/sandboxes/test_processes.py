"""`kill_marked` finds a sandbox's process by its marker even when caught mid-exec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from infra_agent.sandboxes import processes

# Stands in for a process between exec's start and the kernel setting its new environment (an
# empty read, as a stray `setsid sleep` once was under load): empty, then marked after an exec.
EXEC_LATER = (
    "import os, sys, time; sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(0.3); "
    "os.execve('/bin/sleep', ['sleep', '3600'], {'MARK_T': 'v1'})"
)


def test_a_process_seen_with_an_empty_environment_is_looked_at_again() -> None:
    proc = subprocess.Popen([sys.executable, "-c", EXEC_LATER], env={}, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
        assert Path(f"/proc/{proc.pid}/environ").read_bytes() == b""
        assert processes.marked_pids("MARK_T", "v1", lambda: [proc.pid]) == []
        killed = processes.kill_marked("MARK_T", "v1", among=lambda: [proc.pid], rounds=3000)
        assert killed == 1 and proc.wait(timeout=30) == -9
    finally:
        proc.kill()
        proc.wait()


def test_kernel_threads_and_unlisted_processes_are_never_unsure() -> None:
    assert processes._scan("MARK_T", "v1", lambda: [2]) == ([], [])  # kthreadd
    proc = subprocess.Popen(["sleep", "3600"], env={})
    try:
        assert processes._scan("MARK_T", "v1", None)[1] == []  # the whole machine: no retries
    finally:
        proc.kill()
        proc.wait()
