"""Sample a running Python process with ONE long-lived `py-spy record` (the default sampler).

`record_pid(pid, duration_s, interval_s)` starts `py-spy record --format chrometrace --threads
--idle [--native]` once, lets it sample for `duration_s`, stops it (SIGINT: py-spy writes its
file) and rebuilds per-instant snapshots of every thread from the trace's begin/end events.

Why one process: a fresh `py-spy dump --native` per snapshot re-reads the target's memory maps
and loads native symbols while the target is paused (~100-300 ms per dump here); a long-lived
recorder does that once, then each sample pauses the target only while its threads are unwound
(~1 ms with native frames, none with `nonblocking`).

What it cannot see: `py-spy record` does not write GIL ownership. With native frames the holder
is *inferred*: a thread whose innermost frames are Python or interpreter code (no libc wait, no
extension) is executing bytecode, which needs the GIL. Native extension code that keeps the GIL
counts as `running`. Without native frames (`native=False`) nothing tells a GIL wait from sleep,
so every sample is marked `owns_gil=None` (GIL not visible).
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import tempfile
import time
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path
from typing import Any

from infra_agent.feedback.gil.analysis import (
    COND_WAIT,
    GIL_ACQUIRE,
    INTERPRETER_MODULE,
    Frame,
    ThreadSample,
    blocked_in_syscall,
)
from infra_agent.feedback.gil.pyspy import PySpyUnavailable, find_py_spy

DEFAULT_INTERVAL_S = 0.1
"""Seconds between samples of the long-lived recorder (10/s): ~1% pause with native frames."""

THREAD_FRAME = re.compile(r"^thread \((\d+)\)(?:: (.*))?$")


def record_pid(
    pid: int,
    *,
    duration_s: float = 5.0,
    interval_s: float = DEFAULT_INTERVAL_S,
    native: bool = True,
    nonblocking: bool = False,
) -> tuple[list[list[ThreadSample]], float]:
    """Snapshots of `pid` over `duration_s` from one `py-spy record`; (snapshots, seconds).

    Stops early, keeping what it has, when the process exits. `nonblocking` never pauses the
    target and has no native frames (py-spy cannot unwind native stacks without pausing).
    """
    rate = max(1, round(1.0 / interval_s))
    with_native = native and not nonblocking
    with tempfile.TemporaryDirectory(prefix="infra-agent-gil-") as tmp:
        out = Path(tmp) / "trace.json"
        cmd = [find_py_spy(), "record", "--pid", str(pid), "--rate", str(rate)]
        cmd += ["--format", "chrometrace", "--threads", "--idle", "-o", str(out)]
        # A bound of its own, so py-spy ends even if this process dies without stopping it.
        cmd += ["--duration", str(math.ceil(duration_s) + 10)]
        cmd += ["--native"] if with_native else []
        cmd += ["--nonblocking"] if nonblocking else []
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            try:
                proc.wait(timeout=duration_s)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # py-spy writes the trace on Ctrl-C
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.wait()
            raise PySpyUnavailable(f"py-spy record of pid {pid} did not stop") from exc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        elapsed = time.perf_counter() - start
        if not out.exists():
            lines = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
            why = next((ln for ln in lines if ln.startswith("Error")), lines[0] if lines else "")
            raise PySpyUnavailable(
                f"py-spy cannot record pid {pid}: {why[:200] or proc.returncode}"
            )
        try:
            events = json.loads(out.read_text())
        except ValueError as exc:
            raise PySpyUnavailable(f"py-spy trace is not JSON: {exc}") from exc
    return snapshots_from_chrometrace(events, rate=rate, native=with_native), elapsed


def _frame(event: dict[str, Any]) -> Frame:
    args = event.get("args") or {}
    file, line, name = str(args.get("filename") or ""), int(args.get("line") or 0), event["name"]
    # py-spy names a native frame's shared library as its file, with no line.
    native = line == 0 and not file.endswith(".py") and not file.startswith("<")
    return Frame(name=name, file=file, line=line, native=native, module=file if native else "")


def snapshots_from_chrometrace(
    events: list[dict[str, Any]], *, rate: int, native: bool
) -> list[list[ThreadSample]]:
    """Every thread's stack at each sampling instant, from py-spy's chrometrace events.

    py-spy writes a begin (B) event per frame that appears and an end (E) event per frame that
    goes, per thread, at sample times; the file ends by closing every open frame. A thread's
    stack is constant between its events, so it is read back on a grid of `rate` per second.
    """
    if not isinstance(events, list):
        raise PySpyUnavailable("py-spy trace is not a JSON list of events")
    stacks: dict[int, list[Frame]] = defaultdict(list)  # outermost first
    changes: dict[int, tuple[list[float], list[list[Frame]]]] = defaultdict(lambda: ([], []))
    for e in events:
        if e.get("ph") not in ("B", "E"):
            continue
        tid, ts = int(e["tid"]), float(e["ts"]) / 1e6
        stack = stacks[tid]
        if e["ph"] == "B":
            stack.append(_frame(e))
        elif stack:
            stack.pop()
        times, states = changes[tid]
        if times and times[-1] == ts:
            states[-1] = list(stack)
        else:
            times.append(ts)
            states.append(list(stack))
    all_times = [t for times, _ in changes.values() for t in times]
    if not all_times:
        return []
    t0, t_end = min(all_times), max(all_times)
    n = max(1, round((t_end - t0) * rate))
    snapshots = []
    for k in range(n):
        at = t0 + (k + 0.5) / rate
        snap = []
        for times, states in changes.values():
            i = bisect_right(times, at) - 1
            if i >= 0 and states[i]:
                snap.append(_sample(states[i], native))
        snapshots.append(snap)
    return snapshots


def _sample(outer_first: list[Frame], native: bool) -> ThreadSample:
    frames = outer_first[::-1]
    thread = next((m for f in frames if (m := THREAD_FRAME.match(f.name))), None)
    frames = [f for f in frames if not THREAD_FRAME.match(f.name)]
    os_tid = int(thread.group(1)) if thread else 0
    name = (thread.group(2) or str(os_tid)) if thread else "?"
    if not native:
        return ThreadSample(
            thread_id=os_tid, thread_name=name, active=True, owns_gil=None, frames=frames
        )
    inner = frames[: _first_python(frames)]
    return ThreadSample(
        thread_id=os_tid,
        thread_name=name,
        active=not blocked_in_syscall([f for f in inner if not f.name.startswith("0x")]),
        owns_gil=_executes_bytecode(frames, inner),
        frames=frames,
    )


def _first_python(frames: list[Frame]) -> int:
    return next((i for i, f in enumerate(frames) if not f.native), len(frames))


def _executes_bytecode(frames: list[Frame], inner: list[Frame]) -> bool:
    """Inferred GIL holder: in Python code, with only interpreter frames above it (no libc
    call, no extension, no GIL acquire)."""
    if len(inner) == len(frames):
        return False  # no Python frame: a native thread
    return all(
        INTERPRETER_MODULE.search(f.module)
        and not GIL_ACQUIRE.search(f.name)
        and not COND_WAIT.search(f.name)
        for f in inner
    )
