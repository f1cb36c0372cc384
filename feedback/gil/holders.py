"""Exact GIL holders from `py-spy record --gil`, merged into a report built from native stacks.

`py-spy record` writes stacks, not GIL ownership; with `--gil` it keeps only the samples of the
thread that owns the GIL (read from the interpreter, like `py-spy dump`'s `owns_gil`), without
pausing the target (`--nonblocking`). That gives, per thread, the exact share of samples holding
the GIL and the Python stacks it held it in, including native code that keeps the GIL (a ctypes
`PyDLL` call, an extension that never releases it), which the native stacks alone cannot tell.
What it loses: the instants. Blame then names who held the GIL over the whole trace, not only
while the waiter waited (`ThreadBlame.same_instant = False`).
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, Field

from infra_agent.feedback.gil.analysis import top_shares
from infra_agent.feedback.gil.report import GilReport, HolderEvidence


class HeldGil(BaseModel):
    """One thread and Python stack seen holding the GIL in `samples` samples."""

    thread_id: int
    """OS thread id."""
    thread: str
    python_stack: list[str] = Field(default_factory=list)
    """Innermost first, 'function (file)'."""
    samples: int


def merge_holders(report: GilReport, held: list[HeldGil], ticks: int) -> None:
    """Replace the report's inferred holding shares and blame evidence by the exact holders.

    `ticks`: samples the `--gil` recorder attempted (it writes nothing when nobody holds the
    GIL). A thread's waits (seen in native frames) stay; its holding share becomes the exact one
    (at most 1 - waiting); running and idle shrink or grow in proportion to fill the rest.
    """
    if ticks <= 0:
        return
    per_thread: Counter[str] = Counter()  # by name, as the report's rows
    stacks: Counter[tuple[str, tuple[str, ...]]] = Counter()
    held_in: dict[str, Counter[str]] = {}
    for h in held:
        per_thread[h.thread] += h.samples
        if h.python_stack:
            held_in.setdefault(h.thread, Counter())[h.python_stack[0]] += h.samples
        stacks[(h.thread, tuple(h.python_stack[:5]))] += h.samples
    for t in report.threads:
        holding = min(per_thread[t.thread] / ticks, 1.0 - t.waiting)
        rest = 1.0 - t.waiting - holding
        other = t.running + t.idle
        if other > 0:
            t.running, t.idle = rest * t.running / other, rest * t.idle / other
        else:
            t.running, t.idle = rest, 0.0  # sampled executing Python, yet not holding: hand-off
        t.holding = holding
        t.holding_in = top_shares(held_in.get(t.thread, Counter()))
    nobody = max(0, ticks - sum(per_thread.values()))
    # `--gil` writes Python frames only: the holder's busiest native frame comes from the stacks.
    native = {t.thread: [t.top_native[0].rsplit(" ", 1)[0]] for t in report.threads if t.top_native}
    for b in report.blame:
        ranked = [
            (thread, c / ticks, list(stack))
            for (thread, stack), c in stacks.most_common()
            if thread != b.waiter
        ]
        if nobody:
            ranked.append(("nobody", nobody / ticks, []))
        ranked.sort(key=lambda r: -r[1])
        b.evidence = [
            HolderEvidence(
                holder=thread, share=share, python_stack=stack, native_top=native.get(thread, [])
            )
            for thread, share, stack in ranked[:3]
        ]
        b.same_instant = False
    report.gil_inferred = False
