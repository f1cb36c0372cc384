"""A process's threads as the kernel sees them, by the ids py-spy reports.

py-spy tells a running thread from an idle one by `/proc/TID/stat` (state R), looked up by the
thread id it read from the interpreter (`PyThreadState.native_thread_id` on Python 3.11+). For a
process in a pid namespace of its own (a confined SGLang server: bubblewrap) that id is the
namespace's (the scheduler's main thread is 8 inside, 29427 here), the lookup misses, and py-spy
calls every thread active, falling back on a frame-name test that no longer matches
('Condition.wait'): a watchdog asleep in time.sleep was counted running in every sample, and
`--native` cannot unwind those ids (the GIL tracer falls back to dumps). Here each thread is
read by its host id and keyed by its innermost namespace id (`NSpid` in /proc/TID/status), so
callers can put the kernel's answer back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class KernelThread:
    host_tid: int
    state: str
    """/proc state letter: R running or runnable, S sleeping, D disk wait, ..."""
    cpu_s: float
    """User + system CPU time so far, seconds."""
    name: str


def own_pid_namespace(pid: int) -> bool:
    """True when `pid` runs in a pid namespace of its own (its NSpid line has two ids or more)."""
    return len(_nspid(Path(f"/proc/{pid}/status"))) > 1


def kernel_threads(pid: int) -> dict[int, KernelThread]:
    """The threads of `pid` by the id the process itself sees (its innermost namespace's)."""
    out: dict[int, KernelThread] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
            ids = _nspid(task / "status")
        except OSError:
            continue  # the thread ended meanwhile
        name_end = stat.rfind(")")
        fields = stat[name_end + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)
        name = stat[stat.find("(") + 1 : name_end]
        inner = ids[-1] if ids else int(task.name)
        out[inner] = KernelThread(int(task.name), fields[0], cpu, name)
    return out


def _nspid(status: Path) -> list[int]:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []
