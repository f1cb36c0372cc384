"""Sample a running Python process with long-lived `py-spy record`s (the default sampler).

`record_pid(pid, duration_s, interval_s)` starts, once per trace, two recorders side by side:
- `py-spy record --native --idle --threads --format chrometrace`: every thread's stack with
  native frames at each sample; the per-instant snapshots are rebuilt from the trace's begin/end
  events. Native frames show who waits for the GIL (take_gil, a condition wait straight from the
  interpreter), who sleeps and who runs native code;
- `py-spy record --gil --idle --threads --nonblocking --format speedscope`: only the GIL's owner
  at each sample (read from the interpreter), without pausing the target: the exact holding
  shares and the holders' Python stacks (see `holders.py`).

Why long-lived: a fresh `py-spy dump --native` per snapshot loads the native symbols of every
library in the stacks while the target is paused (~70-300 ms per dump here, seconds for
libtorch). A recorder does that once, on its first sample (and once more for each library first
seen later); after that each sample pauses the target only while its threads are unwound.

What it cannot see: chrometrace does not write GIL ownership, so in the snapshots the holder is
*inferred* (a thread executing Python with only interpreter frames above it); the exact holders
from `--gil` then replace the holding shares and the blame evidence, but they lose the instants:
blame names who held the GIL over the trace, not only while the waiter waited.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra_agent.feedback.gil.analysis import (
    COND_WAIT,
    GIL_ACQUIRE,
    INTERPRETER_MODULE,
    blocked_in_syscall,
)
from infra_agent.feedback.gil.holders import HeldGil
from infra_agent.feedback.gil.pyspy import PySpyUnavailable, find_py_spy
from infra_agent.feedback.gil.report import Frame, ThreadSample

DEFAULT_INTERVAL_S = 0.1
"""Seconds between samples (10/s): after the first sample, pauses are ~1 ms per sample."""

THREAD_FRAME = re.compile(r"^thread \((\d+)\)(?:: (.*))?$")


@dataclass
class Recording:
    """What the two recorders saw."""

    snapshots: list[list[ThreadSample]]
    """Every thread at each sampling instant (native frames; GIL holder inferred)."""
    held: list[HeldGil] | None
    """Exact GIL holders (None when the `--gil` recorder failed)."""
    ticks: int
    """Samples attempted per recorder."""
    duration_s: float
    warnings: list[str] = field(default_factory=list)


def record_pid(
    pid: int, *, duration_s: float = 5.0, interval_s: float = DEFAULT_INTERVAL_S
) -> Recording:
    """Record `pid` for `duration_s` (see the module docstring); stops early, keeping what it
    has, when the process exits. Raises PySpyUnavailable when py-spy cannot record it."""
    rate = max(1, round(1.0 / interval_s))
    with tempfile.TemporaryDirectory(prefix="infra-agent-gil-") as tmp:
        stacks_out, gil_out = Path(tmp) / "stacks.json", Path(tmp) / "gil.json"
        # Each recorder has a bound of its own, so it ends even if this process dies first.
        stacks_cmd, gil_cmd = recorder_commands(
            pid, rate=rate, duration_s=duration_s + 10, stacks_out=stacks_out, gil_out=gil_out
        )
        start = time.perf_counter()
        stacks = _Recorder(stacks_cmd)
        gil: _Recorder | None = None
        try:
            # The holder-only recorder starts once the stack recorder samples, so both cover
            # the same window (it writes nothing when nobody holds the GIL: the window counts).
            stacks.attached.wait(timeout=30)
            if stacks.unwind_error:
                raise PySpyUnavailable(f"py-spy cannot unwind native stacks of pid {pid}: "
                                       f"{stacks.unwind_error[:200]}")  # fmt: skip
            if stacks.proc.poll() is None:
                gil = _Recorder(gil_cmd)
                try:
                    stacks.proc.wait(timeout=duration_s)
                except subprocess.TimeoutExpired:
                    pass
            stop = time.perf_counter()
            recorders = [r for r in (gil, stacks) if r is not None]
            for r in recorders:
                if r.proc.poll() is None:
                    r.proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
            errors = {id(r): r.finish() for r in recorders}
        finally:
            for left in (stacks, gil):
                if left is not None and left.proc.poll() is None:
                    left.proc.kill()
                    left.proc.wait()
        window = stop - (gil.attached_at if gil is not None and gil.attached_at else start)
        return read_recording(
            stacks_out, gil_out if gil is not None else None, pid=pid, rate=rate,
            window_s=window, elapsed_s=time.perf_counter() - start,
            stacks_error=errors[id(stacks)], gil_error=errors[id(gil)] if gil else "",
        )  # fmt: skip


def recorder_commands(
    pid: int, *, rate: int, duration_s: float, stacks_out: Path, gil_out: Path, py_spy: str = ""
) -> tuple[list[str], list[str]]:
    """The two `py-spy record` command lines (native stacks; GIL owner) for `pid`, each ending
    by itself after `duration_s`. `py_spy`: its path where they run (default: found here)."""
    base = [py_spy or find_py_spy(), "record", "--pid", str(pid), "--rate", str(rate)]
    base += ["--threads", "--idle", "--duration", str(math.ceil(duration_s))]
    return (
        [*base, "--native", "--format", "chrometrace", "-o", str(stacks_out)],
        [*base, "--gil", "--nonblocking", "--format", "speedscope", "-o", str(gil_out)],
    )


def read_recording(
    stacks_out: Path,
    gil_out: Path | None,
    *,
    pid: int,
    rate: int,
    window_s: float,
    elapsed_s: float,
    stacks_error: str = "",
    gil_error: str = "",
) -> Recording:
    """What the recorders of `recorder_commands` wrote (`gil_out` None: that one did not run).
    `window_s`: how long the GIL recorder sampled. Raises PySpyUnavailable without stacks."""
    snapshots = snapshots_from_chrometrace(_load(stacks_out, pid, stacks_error), rate=rate)
    warnings = []
    held = None
    if gil_out is not None:
        try:
            held = held_from_speedscope(_load(gil_out, pid, gil_error))
        except PySpyUnavailable as exc:
            warnings.append(f"GIL holders not recorded ({exc}): holder inferred from stacks")
    ticks = max(round(window_s * rate), sum(h.samples for h in held or []), 1)
    return Recording(snapshots, held, ticks, elapsed_s, warnings)


class _Recorder:
    """A running `py-spy record`; notes when it starts sampling, and whether py-spy is retrying
    to attach because native unwinding fails (it would retry for ~10 s before giving up)."""

    def __init__(self, cmd: list[str]) -> None:
        env = {**os.environ, "RUST_LOG": "py_spy::python_spy=info"}  # its retry reasons
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.attached = threading.Event()
        self.attached_at = 0.0
        self.unwind_error = ""
        self.errors: list[str] = []
        self._readers = [
            threading.Thread(target=self._read_out, name="py-spy-stdout", daemon=True),
            threading.Thread(target=self._read_err, name="py-spy-stderr", daemon=True),
        ]
        for t in self._readers:
            t.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # also drains it
            if not self.attached.is_set() and "Sampling process" in line:
                self.attached_at = time.perf_counter()
                self.attached.set()
        self.attached.set()  # exited

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if "retrying" in line and "UNW_" in line:
                self.unwind_error = line.split("Error:", 1)[-1].strip()
                self.attached.set()
            elif line.startswith("Error"):
                self.errors.append(line.strip())

    def finish(self) -> str:
        """Wait for it (after SIGINT) and return its error line ('' if none)."""
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for t in self._readers:
            t.join(timeout=5)
        return self.errors[0] if self.errors else ""


def _load(path: Path, pid: int, error: str) -> Any:
    if not path.exists():
        raise PySpyUnavailable(f"py-spy cannot record pid {pid}: {error[:200] or 'no output'}")
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise PySpyUnavailable(f"py-spy output is not JSON: {exc}") from exc


def held_from_speedscope(doc: Any) -> list[HeldGil]:
    """Holder stacks and their sample counts from a `py-spy record --gil --threads` file."""
    try:
        frames = [Frame(name=f["name"], file=f.get("file") or "") for f in doc["shared"]["frames"]]
        counts: Counter[tuple[int, str, tuple[str, ...]]] = Counter()
        for profile in doc["profiles"]:
            for sample in profile["samples"]:
                stack = [frames[i] for i in reversed(sample)]  # innermost first
                thread = next((m for f in stack if (m := THREAD_FRAME.match(f.name))), None)
                if thread is None:
                    continue
                py = tuple(f.label(line=False) for f in stack if not THREAD_FRAME.match(f.name))
                counts[(int(thread.group(1)), thread.group(2) or thread.group(1), py)] += 1
    except (KeyError, IndexError, TypeError) as exc:
        raise PySpyUnavailable(f"unexpected py-spy speedscope file: {exc!r}") from exc
    return [
        HeldGil(thread_id=tid, thread=name, python_stack=list(py), samples=c)
        for (tid, name, py), c in counts.items()
    ]


def _frame(event: dict[str, Any]) -> Frame:
    args = event.get("args") or {}
    file, line, name = str(args.get("filename") or ""), int(args.get("line") or 0), event["name"]
    # A native frame's file is its shared library, or its C source when it has debug info.
    native = not file.endswith(".py") and not file.startswith("<")
    return Frame(name=name, file=file, line=line, native=native, module=file if native else "")


def snapshots_from_chrometrace(events: Any, *, rate: int) -> list[list[ThreadSample]]:
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
    samples: dict[tuple[int, int], ThreadSample] = {}  # a stack held over many instants
    for k in range(n):
        at = t0 + (k + 0.5) / rate
        snap = []
        for tid, (times, states) in changes.items():
            i = bisect_right(times, at) - 1
            if i >= 0 and states[i]:
                if (tid, i) not in samples:
                    samples[(tid, i)] = _sample(states[i])
                snap.append(samples[(tid, i)])
        snapshots.append(snap)
    return snapshots


def _sample(outer_first: list[Frame]) -> ThreadSample:
    frames = outer_first[::-1]
    thread = next((m for f in frames if (m := THREAD_FRAME.match(f.name))), None)
    frames = [f for f in frames if not THREAD_FRAME.match(f.name)]
    os_tid = int(thread.group(1)) if thread else 0
    name = (thread.group(2) or str(os_tid)) if thread else "?"
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
