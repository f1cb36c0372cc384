"""From stack samples to GIL shares and blame: `analyze(snapshots, method=...) -> GilReport`.

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
from typing import Literal

from pydantic import BaseModel, Field

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
NATIVE_ROLES = [
    (re.compile(r"^_?sre_"), "regex engine"),
    (re.compile(r"^(SHA\d*|MD5|BLAKE2\w*|EVP_Digest)\w*_?(Update|Final)|^EVP_hash$"), "hashing"),
    (re.compile(r"^(deflate|inflate)"), "zlib"),
    (re.compile(r"^_*mem(cpy|move|set)"), "memory copy"),
    (re.compile(r"gemm", re.IGNORECASE), "matrix multiply"),
]
"""What a native frame's code is, for a model that does not know CPython's C names."""
SO_TAG = re.compile(r"\.cpython-[^.]*")
"""'_hashlib.cpython-311-x86_64-linux-gnu.so' reads '_hashlib.so'."""

State = Literal["holding", "waiting", "running", "idle"]


class Frame(BaseModel):
    name: str
    file: str = ""
    line: int = 0
    native: bool = False
    module: str = ""
    """Shared library of a native frame."""

    def label(self, *, line: bool = True) -> str:
        if self.native:
            lib = SO_TAG.sub("", self.module.rsplit("/", 1)[-1])
            what = next((f" ({w})" for p, w in NATIVE_ROLES if p.search(self.name)), "")
            return (f"{self.name} [{lib}]" if lib else self.name) + what
        where = self.file.rsplit("/", 1)[-1] + (f":{self.line}" if line else "")
        return f"{self.name} ({where})"


class ThreadSample(BaseModel):
    thread_id: int
    thread_name: str
    active: bool
    owns_gil: bool | None
    """None when the sampler cannot see GIL ownership."""
    frames: list[Frame] = Field(default_factory=list)
    """Innermost first."""


class ThreadGil(BaseModel):
    thread: str
    """Thread name; threads of one name (a worker started anew per call) are one row."""
    thread_id: int
    """OS thread id (the first seen under this name)."""
    samples: int
    holding: float
    """Share of samples holding the GIL (0..1)."""
    waiting: float
    running: float
    """Active without the GIL (native code that released it)."""
    idle: float
    top_functions: list[str] = Field(default_factory=list)
    """Most frequent innermost Python frames, with their share."""
    holding_in: list[str] = Field(default_factory=list)
    """Most frequent innermost Python frames while holding the GIL, with their share of the
    holding samples."""
    top_native: list[str] = Field(default_factory=list)
    """Most frequent innermost named native frames while holding the GIL or running (the C
    code under the Python frame: `sre_ucs1_search` of the regex engine, a hash), with their
    share of the thread's samples; only those at 10% or more."""


class HolderEvidence(BaseModel):
    holder: str
    """Thread that held the GIL while the waiter waited ('nobody' during hand-offs)."""
    share: float
    """Share of the waiter's waiting samples; without `same_instant`, of all the trace's
    samples."""
    python_stack: list[str] = Field(default_factory=list)
    """Holder's Python frames, innermost first (up to 5)."""
    native_top: list[str] = Field(default_factory=list)
    """Holder's innermost named native frames (up to 3)."""


class ThreadBlame(BaseModel):
    waiter: str
    waiting: float
    waiting_at: list[str] = Field(default_factory=list)
    """Where the waiter waits, most frequent first, with the share of its waiting samples: its
    innermost Python line, after the extension function that retakes the GIL if any."""
    evidence: list[HolderEvidence] = Field(default_factory=list)
    """The three most frequent holder stacks, most frequent first."""
    same_instant: bool = True
    """Evidence from the snapshots in which the waiter waited (`py-spy dump`); False: the GIL's
    holders over the whole trace (`py-spy record --gil`), not only while this thread waited."""


class Culprit(BaseModel):
    """The thread the trace blames for others' GIL waits, and where it was."""

    thread: str | None = None
    function: str | None = None
    """Innermost Python frame as 'file.py:function'."""
    stack: list[str] = Field(default_factory=list)
    """The holder's Python frames as 'file.py:function', innermost first."""
    detail: str = "no thread was seen holding the GIL"


def frame_function(label: str) -> str:
    """'intranode_dispatch (dispatch.py:19)' -> 'dispatch.py:intranode_dispatch'."""
    name, _, where = label.partition(" (")
    return f"{where.rstrip(')').rsplit(':', 1)[0]}:{name}" if where else name


class GilReport(BaseModel):
    method: str
    gil_visible: bool
    gil_inferred: bool = False
    """The holder is inferred from stacks (executing bytecode), not read from the interpreter:
    native code that keeps the GIL counts as `running`."""
    pid: int | None = None
    snapshots: int
    duration_s: float
    threads: list[ThreadGil] = Field(default_factory=list)
    blame: list[ThreadBlame] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    def culprit(self) -> Culprit:
        """The most waiting thread's main blamed holder, or else the thread holding the GIL
        most (with the busiest other thread's share without it)."""
        for entry in self.blame:
            for ev in entry.evidence:
                if ev.holder != "nobody" and ev.python_stack:
                    stack = [frame_function(f) for f in ev.python_stack]
                    return Culprit(
                        thread=ev.holder,
                        function=stack[0],
                        stack=stack,
                        detail=f"holds the GIL in {ev.share:.0%} of the samples in which thread "
                        f"'{entry.waiter}' waits for it ({entry.waiting:.0%} of its samples)",
                    )
        holders = sorted(self.threads, key=lambda t: t.holding, reverse=True)
        if not holders or holders[0].holding <= 0:
            return Culprit()
        top = holders[0]
        where = top.holding_in or top.top_functions
        function = frame_function(where[0].rsplit(" ", 1)[0]) if where else None
        detail = f"holds the GIL in {top.holding:.0%} of samples"
        others = sorted(
            (t for t in self.threads if t.thread != top.thread),
            key=lambda t: t.waiting + t.running,
            reverse=True,
        )
        if others:
            other = others[0]
            detail += (
                f"; thread '{other.thread}' is not idle but has no GIL in "
                f"{other.waiting + other.running:.0%} of samples (waiting for it)"
            )
        return Culprit(
            thread=top.thread,
            function=function,
            stack=[function] if function else [],
            detail=detail,
        )

    def render(self) -> str:
        lines = []
        for b in self.blame[:3]:
            for ev in b.evidence[:1]:
                where = " <- ".join([*ev.native_top[:1], *ev.python_stack[:3]]) or "?"
                held = (
                    f"meanwhile {ev.holder!r} held it {ev.share:.0%} of that time"
                    if b.same_instant
                    else f"over the trace {ev.holder!r} held it {ev.share:.0%} of the time"
                )
                at = f" (at {b.waiting_at[0]})" if b.waiting_at else ""
                lines.append(
                    f"thread {b.waiter!r} waits for the GIL in {b.waiting:.0%} of samples{at}; "
                    f"{held}, in {where}"
                )
        lines.append(
            f"{self.snapshots} snapshots over {self.duration_s:.1f} s via {self.method}"
            + ("" if self.gil_visible else " (GIL ownership NOT visible)")
        )
        for t in sorted(self.threads, key=lambda t: -(t.waiting + t.holding))[:6]:
            top = t.top_functions[0] if t.top_functions else "-"
            if t.top_native:
                top += f"; native {t.top_native[0]}"
            if self.gil_visible:
                runs = "runs-native" if self.gil_inferred else "runs-no-GIL"
                lines.append(
                    f"  {t.thread}: holds {t.holding:.0%} waits {t.waiting:.0%} "
                    f"{runs} {t.running:.0%} idle {t.idle:.0%}; top {top}"
                )
            else:
                lines.append(f"  {t.thread}: active {t.running:.0%} idle {t.idle:.0%}; top {top}")
        for b in self.blame[:2]:
            for ev in b.evidence[1:3]:
                when = f"while {b.waiter!r} waited" if b.same_instant else "over the trace"
                where = " <- ".join([*ev.native_top[:1], *ev.python_stack[:3]]) or "?"
                lines.append(f"  also {when}: {ev.holder!r} {ev.share:.0%} in {where}")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


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
    # Keyed by thread name: a thread started anew per call (a worker per request) is one row.
    states: dict[str, Counter[str]] = defaultdict(Counter)
    ids: dict[str, int] = {}
    tops: dict[str, Counter[str]] = defaultdict(Counter)
    natives: dict[str, Counter[str]] = defaultdict(Counter)
    held_in: dict[str, Counter[str]] = defaultdict(Counter)
    sites: dict[str, Counter[str]] = defaultdict(Counter)
    holders: dict[str, Counter[tuple[str, tuple[str, ...], tuple[str, ...]]]] = defaultdict(Counter)
    for snap in snapshots:
        holder = next((s for s in snap if s.owns_gil), None)
        for s in snap:
            name = s.thread_name
            ids.setdefault(name, s.thread_id)
            state = classify(s)
            states[name][state] += 1
            py = _python_frames(s, 1)
            if py:
                tops[name][py[0]] += 1
                if state == "holding":
                    held_in[name][py[0]] += 1
            native = _native_above_python(s.frames)
            if native and state in ("holding", "running"):
                natives[name][native[0].label()] += 1
            if state == "waiting":
                sites[name][_waiting_site(s)] += 1
                key = (
                    ("nobody", (), ())
                    if holder is None
                    else (
                        holder.thread_name,
                        tuple(_python_frames(holder)),
                        tuple(f.label() for f in _native_above_python(holder.frames)[:3]),
                    )
                )
                holders[name][key] += 1
    report = GilReport(
        method=method,
        gil_visible=gil_visible,
        pid=pid,
        snapshots=len(snapshots),
        duration_s=duration_s,
    )
    for name, counts in states.items():
        n = sum(counts.values())
        report.threads.append(
            ThreadGil(
                thread=name,
                thread_id=ids[name],
                samples=n,
                holding=counts["holding"] / n,
                waiting=counts["waiting"] / n,
                running=counts["running"] / n,
                idle=counts["idle"] / n,
                top_functions=[f"{fn} {c / n:.0%}" for fn, c in tops[name].most_common(3)],
                holding_in=top_shares(held_in[name]),
                top_native=[
                    f"{fn} {c / n:.0%}" for fn, c in natives[name].most_common(2) if c / n >= 0.1
                ],
            )
        )
        waits = counts["waiting"]
        if gil_visible and waits and waits / n >= blame_threshold:
            evidence = [
                HolderEvidence(
                    holder=h, share=c / waits, python_stack=list(py), native_top=list(nat)
                )
                for (h, py, nat), c in holders[name].most_common(3)
            ]
            report.blame.append(
                ThreadBlame(
                    waiter=name,
                    waiting=waits / n,
                    waiting_at=[f"{w} {c / waits:.0%}" for w, c in sites[name].most_common(3)],
                    evidence=evidence,
                )
            )
    report.blame.sort(key=lambda b: -b.waiting)
    if not gil_visible:
        report.warnings.append(
            "in-process sampling of sys._current_frames(): cannot see which thread holds the GIL"
        )
    if len(snapshots) < 20:
        report.warnings.append(f"only {len(snapshots)} snapshots: shares are coarse")
    return report
