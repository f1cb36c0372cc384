"""The GIL trace's records: stack samples in (`Frame`, `ThreadSample`), per-thread shares and
blame out (`ThreadGil`, `ThreadBlame`, `HolderEvidence`), the `GilReport` that holds them with
its `culprit()` and its `render()` for a model (the most-waiting thread, where it waits and who
held the GIL meanwhile, first). Built by `analysis.analyze`.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

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
