"""The `dump` sampler: repeated `py-spy dump --json [--native]`, a fresh py-spy per snapshot.

`sample_pid(pid, duration_s, interval_s)` returns snapshots (every thread, innermost frame
first) with py-spy's `owns_gil` flag and thread activity, read at the same instant as the
stacks. The cost: each py-spy re-reads the target's maps, and with native frames loads the
symbols of every library in the stacks while the target is paused (~70-300 ms per dump here,
seconds with libtorch), hence one snapshot per second (`DEFAULT_INTERVAL_S`) and +30-60%
slowdown even so; `record.py` is the default sampler for that reason. `native=False` pauses
briefly but cannot tell a GIL wait from native work; `nonblocking=True` does not pause at all
(Python frames only, may be torn). Needs ptrace permission on the target (root, same user with
kernel.yama.ptrace_scope=0, or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from infra_agent.errors import UserError
from infra_agent.feedback.gil.report import Frame, ThreadSample
from infra_agent.feedback.gil.threads import kernel_threads, own_pid_namespace
from infra_agent.sandboxes.proctree import alive

DEFAULT_INTERVAL_S = 1.0
"""Seconds between snapshots of the `dump` sampler."""
TORN_RETRIES = 12
"""Non-blocking dumps that may fail in a row (each caught a thread mid-update) before the
sampling does: at a torn-read rate of 30% a 4-snapshot trace then fails about once in 470,000
(4 x 0.3^12), at 50% once in 1,000."""
TORN_PAUSE_S = 0.01


class PySpyUnavailable(UserError):
    """py-spy is missing or cannot attach to the process."""


def find_py_spy() -> str:
    """py-spy next to this interpreter (the venv), else on PATH."""
    local = Path(sys.executable).parent / "py-spy"
    if local.is_file():
        return str(local)
    found = shutil.which("py-spy")
    if found is None:
        raise PySpyUnavailable("py-spy not found (pip install py-spy)")
    return found


def parse_dump(doc: Any) -> list[ThreadSample]:
    """Threads of one `py-spy dump --json` document."""
    if not isinstance(doc, list):
        raise PySpyUnavailable("py-spy dump did not return a JSON list of threads")
    threads = []
    for t in doc:
        frames = [
            Frame(
                name=str(f.get("name", "?")),
                file=str(f.get("filename") or ""),
                line=int(f.get("line") or 0),
                native=f.get("module") is not None,
                module=str(f.get("module") or ""),
            )
            for f in t.get("frames", [])
        ]
        threads.append(
            ThreadSample(
                thread_id=int(t.get("os_thread_id") or t.get("thread_id") or 0),
                thread_name=str(t.get("thread_name") or t.get("thread_id")),
                active=bool(t.get("active")),
                owns_gil=bool(t.get("owns_gil")),
                frames=frames,
            )
        )
    return threads


def dump_once(pid: int, *, native: bool = True, nonblocking: bool = False) -> list[ThreadSample]:
    """One snapshot of every thread of `pid`. For a process in a pid namespace of its own,
    whose threads py-spy cannot look up (`threads.py`), each thread's activity is the kernel's
    state read just before the dump (as py-spy reads it)."""
    kernel = kernel_threads(pid) if own_pid_namespace(pid) else None
    cmd = [find_py_spy(), "dump", "--pid", str(pid), "--json"]
    if native and not nonblocking:  # py-spy cannot unwind native stacks without pausing
        cmd.append("--native")
    if nonblocking:
        cmd.append("--nonblocking")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        raise PySpyUnavailable(f"py-spy dump of pid {pid} timed out") from exc
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        # py-spy prints "Error: ..." then a backtrace; the error line is the useful one.
        why = next((ln for ln in lines if ln.startswith("Error")), lines[0] if lines else "")
        raise PySpyUnavailable(f"py-spy cannot sample pid {pid}: {why[:200] or proc.returncode}")
    try:
        threads = parse_dump(json.loads(proc.stdout))
    except ValueError as exc:
        raise PySpyUnavailable(f"py-spy dump output is not JSON: {exc}") from exc
    for t in threads if kernel else ():
        found = kernel.get(t.thread_id) if kernel else None
        if found is not None:
            t.active = found.state == "R"
    return threads


def sample_pid(
    pid: int,
    *,
    duration_s: float = 5.0,
    interval_s: float = DEFAULT_INTERVAL_S,
    max_snapshots: int = 200,
    native: bool = True,
    nonblocking: bool = False,
) -> tuple[list[list[ThreadSample]], float]:
    """Snapshots of `pid` for `duration_s` (at most one per `interval_s`); (snapshots, seconds).

    Stops early, keeping what it has, when the process exits. A non-blocking dump reads the
    threads while they run and now and then catches one mid-update ("Failed to get stack traces":
    seen on a confined SGLang scheduler, under load and on a quiet machine alike); such a dump is
    tried again at once, and the sampling fails only after TORN_RETRIES failed dumps in a row (a
    ratio over a 4-second trace's four dumps failed a quiet suite run, and two in a row a loaded
    one), or when it ends without a snapshot.
    """
    snapshots: list[list[ThreadSample]] = []
    failed = 0
    last: PySpyUnavailable | None = None
    start = time.perf_counter()
    while time.perf_counter() - start < duration_s and len(snapshots) < max_snapshots:
        tick = time.perf_counter()
        try:
            snapshots.append(dump_once(pid, native=native, nonblocking=nonblocking))
            failed = 0
        except PySpyUnavailable as exc:
            if snapshots and not alive(pid):
                break
            failed += 1
            if not nonblocking or failed >= TORN_RETRIES:
                raise
            last = exc
            time.sleep(TORN_PAUSE_S)
            continue
        rest = interval_s - (time.perf_counter() - tick)
        if rest > 0:
            time.sleep(rest)
    if not snapshots and last is not None:
        raise last
    return snapshots, time.perf_counter() - start
