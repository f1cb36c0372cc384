"""Watching a sandboxed worker from outside through /proc: its threads and any other process
the candidate started (work left running after a call returned).

Which processes belong to the sandbox: every process in the anchor's PID namespace when the
sandbox has its own (bubblewrap/unshare --pid, a container), otherwise the anchor's process tree
plus its session. The worker is the member whose command line names the worker script.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, ValueError):
        return ""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of a process, or None if it is gone."""
    text = _read(PROC / str(pid) / "stat")
    if not text:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[3])


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(PROC / str(pid) / "ns" / "pid")
    except OSError:
        return None


def _all_pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in (PROC / str(pid) / "task").glob("*/children"):
        out.extend(int(x) for x in _read(task).split())
    return out


def _cmdline(pid: int) -> str:
    return _read(PROC / str(pid) / "cmdline").replace("\0", " ")


def thread_ids(pid: int) -> set[int]:
    try:
        return {int(t.name) for t in (PROC / str(pid) / "task").iterdir() if t.name.isdigit()}
    except OSError:
        return set()


def thread_count(pid: int) -> int:
    for line in _read(PROC / str(pid) / "status").splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


class ProcessWatch:
    """Counts the worker's threads and the sandbox's other live processes."""

    def __init__(self, anchor_pid: int, marker: str) -> None:
        self.anchor = anchor_pid
        self.marker = marker
        own = _pid_ns(os.getpid())
        ns = _pid_ns(anchor_pid) if anchor_pid > 0 else None
        self.namespace = ns if ns is not None and ns != own else None
        self.visible = anchor_pid > 0 and (PROC / str(anchor_pid)).exists()
        self.method = "pidns" if self.namespace else "tree" if self.visible else "self-report"
        """How leftovers are found: 'pidns', 'tree' (process tree + session) or 'self-report'
        (the worker's own count: the harness cannot see it)."""
        self.warm_threads: int | None = None
        self.warm_tids: set[int] | None = None
        """Thread ids alive after warm-up (e.g. a compute pool): any other thread alive after a
        call was started by the candidate after warm-up and outlived its call."""
        self.base_members: set[int] | None = None
        """Sandbox processes once the worker answered its first ping, before any candidate code
        ran: the only processes besides the worker allowed to exist afterwards."""
        self.worker_pid: int | None = None

    def started(self) -> None:
        """Call once the worker is up and before candidate code runs. If the worker lives in a
        PID namespace of its own (bubblewrap runs it below the anchor), watch that namespace:
        orphans of a double fork stay in it."""
        worker = self._worker(self.members())
        if self.namespace is None and worker is not None:
            ns = _pid_ns(worker)
            if ns is not None and ns != _pid_ns(os.getpid()):
                self.namespace, self.method = ns, "pidns"
        self.base_members = self.members()
        self._worker(self.base_members)

    def members(self) -> set[int]:
        """Live (non-zombie) processes that belong to the sandbox."""
        found: set[int] = set()
        if self.namespace is not None:
            for pid in _all_pids():
                if _pid_ns(pid) == self.namespace:
                    found.add(pid)
        elif self.visible:
            stack = [self.anchor]
            while stack:
                pid = stack.pop()
                if pid not in found:
                    found.add(pid)
                    stack.extend(_children(pid))
            anchor = _stat(self.anchor)
            if anchor is not None:
                for pid in _all_pids():
                    info = _stat(pid)
                    if info is not None and info[2] == anchor[2] and anchor[2] != _own_session():
                        found.add(pid)
        return {p for p in found if (s := _stat(p)) is not None and s[0] not in ("Z", "X")}

    def _worker(self, members: set[int]) -> int | None:
        if self.worker_pid in members:
            return self.worker_pid
        # Wrappers (bwrap, setpriv) carry the script name in their argv too: take the innermost.
        marked = {pid for pid in members if self.marker in _cmdline(pid)}
        for pid in sorted(marked):
            if not marked.intersection(_children(pid)):
                self.worker_pid = pid
                return pid
        return None

    def mark_warm(self, reported_threads: int = 0) -> None:
        """Record the worker's thread count after warm-up (compute pools started lazily)."""
        if self.method == "self-report":
            self.warm_threads = reported_threads
            return
        worker = self._worker(self.members())
        self.warm_threads = thread_count(worker) if worker is not None else None
        self.warm_tids = thread_ids(worker) if worker is not None else None

    def problem(self, reported_threads: int = 0) -> str | None:
        """Why the sandbox is not back at its warm state after a call, or None."""
        if self.method == "self-report":
            if self.warm_threads is not None and reported_threads > self.warm_threads:
                extra = reported_threads - self.warm_threads
                return f"candidate left {extra} extra thread(s) running after the call returned"
            return None
        if self.base_members is None:
            return None
        members = self.members()
        worker = self._worker(members)
        extra_procs = sorted(members - self.base_members - ({worker} if worker else set()))
        if extra_procs:
            names = ", ".join(f"{p} ({_cmdline(p)[:60].strip()})" for p in extra_procs[:3])
            return f"candidate left {len(extra_procs)} child process(es) running: {names}"
        if worker is not None and self.warm_tids is not None:
            new = thread_ids(worker) - self.warm_tids
            if new:
                return (
                    f"candidate left {len(new)} thread(s) running after the call returned "
                    f"(started after warm-up; {len(self.warm_tids)} threads after warm-up)"
                )
        return None


def _own_session() -> int:
    return os.getsid(0)
