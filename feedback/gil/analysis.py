"""From stack samples to GIL shares and blame: `analyze(snapshots, method=...) -> GilReport`.
The records (samples, shares, blame, the report and its rendering) are `report.py`.

A *snapshot* is every thread of the process at one instant. Each thread's sample is put in one
state:
- `holding`: py-spy says the thread owns the GIL (`py-spy dump`), or, from `py-spy record`
  which does not write ownership, the thread is executing bytecode (see `record.py`);
- `waiting`: it is blocked taking the GIL: a native frame named like take_gil,
  PyEval_RestoreThread, PyEval_AcquireThread, PyGILState_Ensure; or (CPython's take_gil is
  static and often unnamed) the innermost named native frame is a condition-variable wait called
  straight from the interpreter (a Python frame or a CPython function, not an extension); or a
  timed condition wait called straight from a C extension's own code (`_hashlib` after hashing a
  big buffer with the GIL released): py-spy drops the interpreter's frames between them, the
  `PyEval_RestoreThread` -> take_gil of the extension's `Py_END_ALLOW_THREADS`;
- `running`: active without the GIL (native code that released it; from `py-spy record`, any
  native extension code, with or without the GIL);
- `idle`: blocked on something else (sleep, lock, I/O).
Blame: for a thread waiting in at least `blame_threshold` of its samples, which thread held
the GIL in those same snapshots, with the holder's Python frames and innermost native frames;
the three most frequent holder stacks are the evidence. Without GIL visibility (in-process
fallback) only `running`/`idle` by innermost Python function are reported.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from infra_agent.feedback.gil.report import (
    Frame,
    GilReport,
    HolderEvidence,
    ThreadBlame,
    ThreadGil,
    ThreadSample,
)

GIL_ACQUIRE = re.compile(
    r"take_gil|PyEval_RestoreThread|PyEval_AcquireThread|PyGILState_Ensure|PyEval_AcquireLock"
)
COND_WAIT = re.compile(r"pthread_cond_(timed)?wait|__futex_abstimed_wait|futex_wait")
INTERPRETER_MODULE = re.compile(r"libpython|/python[0-9.]*$|/bin/python")
TIMED_COND_WAIT = re.compile(r"pthread_cond_timedwait")
"""take_gil's wait (CPython 3.8-3.13); C++ timed waits go through pthread_cond_clockwait."""
EXTENSION_MODULE = re.compile(r"\.cpython-[^/]*\.so$|\.abi3\.so$|/lib-dynload/|\.pyd$|\.(c|h|cpp)$")
"""A Python extension module's code: its library (`py-spy dump`), or its C source (`py-spy
record` names a frame by its source file when the library has debug info)."""
HEX = re.compile(r"^0x[0-9a-f]+$")
State = Literal["holding", "waiting", "running", "idle"]


def _native_above_python(frames: Sequence[Frame]) -> list[Frame]:
    """Named native frames above (inner to) the innermost Python frame."""
    out = []
    for f in frames:
        if not f.native:
            break
        if not HEX.match(f.name):
            out.append(f)
    return out


def classify(sample: ThreadSample) -> State:
    """One thread sample's state (see the module docstring)."""
    if sample.owns_gil:
        return "holding"
    if any(f.native and GIL_ACQUIRE.search(f.name) for f in sample.frames):
        return "waiting"
    inner = _native_above_python(sample.frames)
    if sample.owns_gil is not None and inner and COND_WAIT.search(inner[0].name):
        rest = inner[1:]
        if not rest or INTERPRETER_MODULE.search(rest[0].module):
            return "waiting"
        if TIMED_COND_WAIT.search(inner[0].name) and all(
            EXTENSION_MODULE.search(f.module) for f in rest
        ):
            return "waiting"  # an extension retaking the GIL after releasing it
    if sample.owns_gil is None:
        return "running" if sample.active else "idle"
    return "running" if sample.active and not blocked_in_syscall(inner) else "idle"


def blocked_in_syscall(inner: list[Frame]) -> bool:
    """The innermost named native frame is a blocking call (sleep, wait, poll, read...)."""
    return bool(inner) and bool(
        re.search(
            r"nanosleep|sem_.*wait|cond_.*wait|epoll_wait|poll|select|recv|read", inner[0].name
        )
    )


def _python_frames(sample: ThreadSample, limit: int = 5, line: bool = False) -> list[str]:
    return [f.label(line=line) for f in sample.frames if not f.native][:limit]


def top_shares(counts: Counter[str], top: int = 3) -> list[str]:
    """'function 80%' for the most frequent entries, share of the counter's total."""
    n = sum(counts.values())
    return [f"{key} {c / n:.0%}" for key, c in counts.most_common(top)]


def _waiting_site(sample: ThreadSample) -> str:
    """Where a thread waits for the GIL: its innermost Python line, after the C function it
    called when that is an extension's (the GIL retaken inside `_hashlib`)."""
    py = _python_frames(sample, 1, line=True)
    called = [f for f in _native_above_python(sample.frames) if EXTENSION_MODULE.search(f.module)]
    return " <- ".join([*(f.label() for f in called[-1:]), *py]) or "?"


Holder = tuple[str, tuple[str, ...], tuple[str, ...]]
"""(holder thread, its Python stack, its native frames) seen while a thread waited."""


@dataclass
class _Tally:
    """Per thread name, what the snapshots showed it doing (a thread started anew per call, a
    worker per request, is one row)."""

    states: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    ids: dict[str, int] = field(default_factory=dict)
    tops: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    natives: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    held_in: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    sites: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    holders: defaultdict[str, Counter[Holder]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, snap: list[ThreadSample]) -> None:
        """Count one snapshot of every thread."""
        holder = next((s for s in snap if s.owns_gil), None)
        for s in snap:
            name = s.thread_name
            self.ids.setdefault(name, s.thread_id)
            state = classify(s)
            self.states[name][state] += 1
            py = _python_frames(s, 1)
            if py:
                self.tops[name][py[0]] += 1
                if state == "holding":
                    self.held_in[name][py[0]] += 1
            native = _native_above_python(s.frames)
            if native and state in ("holding", "running"):
                self.natives[name][native[0].label()] += 1
            if state == "waiting":
                self.sites[name][_waiting_site(s)] += 1
                key: Holder = (
                    ("nobody", (), ())
                    if holder is None
                    else (
                        holder.thread_name,
                        tuple(_python_frames(holder)),
                        tuple(f.label() for f in _native_above_python(holder.frames)[:3]),
                    )
                )
                self.holders[name][key] += 1

    def row(self, name: str) -> ThreadGil:
        """The thread's shares of the samples."""
        counts = self.states[name]
        n = sum(counts.values())
        return ThreadGil(
            thread=name,
            thread_id=self.ids[name],
            samples=n,
            holding=counts["holding"] / n,
            waiting=counts["waiting"] / n,
            running=counts["running"] / n,
            idle=counts["idle"] / n,
            top_functions=[f"{fn} {c / n:.0%}" for fn, c in self.tops[name].most_common(3)],
            holding_in=top_shares(self.held_in[name]),
            top_native=[
                f"{fn} {c / n:.0%}" for fn, c in self.natives[name].most_common(2) if c / n >= 0.1
            ],
        )

    def blame(self, name: str, threshold: float) -> ThreadBlame | None:
        """Who held the GIL while the thread waited, when it waited at least `threshold` of
        its samples."""
        counts = self.states[name]
        n = sum(counts.values())
        waits = counts["waiting"]
        if not waits or waits / n < threshold:
            return None
        evidence = [
            HolderEvidence(holder=h, share=c / waits, python_stack=list(py), native_top=list(nat))
            for (h, py, nat), c in self.holders[name].most_common(3)
        ]
        return ThreadBlame(
            waiter=name,
            waiting=waits / n,
            waiting_at=[f"{w} {c / waits:.0%}" for w, c in self.sites[name].most_common(3)],
            evidence=evidence,
        )


def analyze(
    snapshots: Sequence[list[ThreadSample]],
    *,
    method: str,
    duration_s: float,
    pid: int | None = None,
    blame_threshold: float = 0.2,
) -> GilReport:
    """Turn snapshots into per-thread shares and blame (see the module docstring)."""
    gil_visible = any(s.owns_gil is not None for snap in snapshots for s in snap)
    tally = _Tally()
    for snap in snapshots:
        tally.add(snap)
    report = GilReport(
        method=method,
        gil_visible=gil_visible,
        pid=pid,
        snapshots=len(snapshots),
        duration_s=duration_s,
    )
    for name in tally.states:
        report.threads.append(tally.row(name))
        blame = tally.blame(name, blame_threshold) if gil_visible else None
        if blame is not None:
            report.blame.append(blame)
    report.blame.sort(key=lambda b: -b.waiting)
    if not gil_visible:
        report.warnings.append(
            "in-process sampling of sys._current_frames(): cannot see which thread holds the GIL"
        )
    if len(snapshots) < 20:
        report.warnings.append(f"only {len(snapshots)} snapshots: shares are coarse")
    return report
