"""A server's processes as /proc shows them: the tree, their CPU time, and a freeze.

An experiment measures one arm's server at a time. A confined server's cgroup is frozen while
the other arm is measured (`sandboxes.cgroups`); where no cgroup can be made, `freeze(root)`
stops every process of its tree (SIGSTOP), so it takes no CPU from the arm being measured: an
idle SGLang scheduler polls its sockets without sleeping and holds a whole core, and a patched
server could do any other work while it waits. `thaw(root)` continues them. `cpu_seconds(pids)`
sums the user and system time of processes and of the children they reaped (clock ticks, 10 ms
here). `lineage` and `outside_tree` tell a group's processes apart: the confinement's own, the
server's command and its tree, and anything that left it (a double fork).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
FREEZE_WAIT_S = 5.0
"""How long `freeze` waits for every process to report itself stopped."""


def stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces and parentheses):
    index 0 is the state, 1 the parent, 3 the session, 6 the flags, 11-14 utime stime cutime
    cstime, 19 the start time. None when the process is gone or unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rsplit(")", 1)[-1].split()


def children_map() -> dict[int, list[int]]:
    """Parent pid -> its children's pids, for every process on the machine."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_fields(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    return children


def lineage(pids: set[int], top: int, depth: int) -> list[int]:
    """[top, its oldest live child among `pids`, that one's oldest, ...], `depth` steps down
    (shorter where a level has no child yet)."""
    info = {
        p: (int(f[1]), int(f[19]))  # parent, start time
        for p in pids
        if (f := stat_fields(p)) is not None and f[0] not in "ZX"
    }
    found = [top]
    for _ in range(depth):
        kids = [p for p, (parent, _) in info.items() if parent == found[-1]]
        if not kids:
            break
        found.append(min(kids, key=lambda p: info[p][1]))
    return found


def outside_tree(pids: set[int], root: int) -> set[int]:
    """The live processes among `pids` that are neither `root` nor below it, following parents
    through `pids` only (a double-forked or orphaned process of a group)."""
    parent = {p: int(f[1]) for p in pids if (f := stat_fields(p)) is not None and f[0] not in "ZX"}
    outside = set()
    for pid in parent:
        at, seen = pid, set()
        while at != root and at in parent and at not in seen:
            seen.add(at)
            at = parent[at]
        if at != root:
            outside.add(pid)
    return outside


def command_line(pid: int) -> str:
    """`pid`'s command line, arguments joined by spaces ('' when gone or unreadable)."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
            .strip()
        )
    except OSError:
        return ""


def descendants(pid: int) -> set[int]:
    """All live descendants of `pid` (from /proc)."""
    tree = children_map()
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def threads(pid: int) -> list[int]:
    """The thread ids of `pid` (none once it is gone)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def tree(root: int) -> set[int]:
    """`root` and its live descendants."""
    return {p for p in descendants(root) | {root} if alive(p)}


def cpu_seconds(pids: set[int]) -> float:
    """User + system CPU seconds of `pids` and of the children they have reaped."""
    total = 0
    for pid in pids:
        fields = stat_fields(pid)
        if fields is not None:
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / CLOCK_TICKS


def cpu_by_name(pids: set[int]) -> dict[str, float]:
    """CPU seconds per process name (/proc/PID/comm, e.g. 'sglang::schedul'), summed."""
    out: dict[str, float] = {}
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        out[name] = out.get(name, 0.0) + cpu_seconds({pid})
    return out


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def freeze(root: int) -> set[int]:
    """SIGSTOP `root` and every descendant (again for any started meanwhile) and wait until each
    reports itself stopped. Returns the frozen pids. TimeoutError if one keeps running."""
    frozen: set[int] = set()
    while new := tree(root) - frozen:
        _signal(new, signal.SIGSTOP)
        frozen |= new
    deadline = time.monotonic() + FREEZE_WAIT_S
    while running := {
        p for p in frozen if (f := stat_fields(p)) is not None and f[0] not in "TtZX"
    }:
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes {sorted(running)} did not stop")
        time.sleep(0.005)
    return frozen


def thaw(root: int) -> None:
    """SIGCONT `root` and every descendant."""
    _signal(tree(root), signal.SIGCONT)
