"""Watching a sandboxed worker from outside through /proc: its threads and any other process
the candidate started (work left running after a call returned).

Which processes belong to the sandbox: every process in the anchor's PID namespace when the
sandbox has its own (bubblewrap/unshare --pid, a container), otherwise the anchor's process tree
plus its session. The worker is the member whose command line names the worker script.

Threads: the watch starts before any candidate code runs (before preloads and the first import),
so every thread but the worker's own was started by candidate code or its libraries, at import,
warm-up or later. A thread alive after a call is tolerated only as an idle compute-pool thread
(torch's pools start lazily): at most as many as the worker's torch pools may hold (its own
report: an upper bound only), and idle. Idle is measured, not assumed (/proc schedstat per thread;
the process total counts threads that already exited): after a call returns these threads must
sleep, having used at most SPIN_LIMIT_S of CPU each (an OpenMP spin-wait), and then use at most
IDLE_CPU_LIMIT_S in all until the next call, puts in between included. Busy is CPU used, not
wall time: on a loaded machine a thread can wait for a CPU (runnable, using none) well past
SETTLE_S, and that is not work. Work done while
no call runs is a violation whatever the thread's name or origin, unless the task allows
`background` work (then threads may outlive calls and work between them).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from infra_agent.sandboxes.proctree import stat_fields

PROC = Path("/proc")
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
SETTLE_S = 2.0
"""How long (seconds) new threads are waited for to go idle after a call returns (an OpenMP pool
spin-waits a few milliseconds after its last parallel region, then sleeps; on a loaded machine a
thread may wait far longer for a CPU to do that on). Past it, one still using CPU is work left
running; one runnable but using none is tolerated, and what it does later is measured up to the
next call (`before_request`)."""
SPIN_LIMIT_S = 0.03
"""CPU time (seconds) per new thread allowed while it settles (the spin-wait)."""
IDLE_CPU_LIMIT_S = 0.003
"""CPU time (seconds) new or exited threads may use once settled, up to the next request: an
idle pool thread uses none."""
POLL_S = 0.01


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except (OSError, ValueError):
        return ""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of a process, or None if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else (fields[0], int(fields[1]), int(fields[3]))


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


def _ticks_ns(stat_text: str) -> int:
    """utime + stime (ns, clock-tick resolution) from a /proc stat line."""
    if not stat_text:
        return 0
    fields = stat_text[stat_text.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * TICK_NS


def thread_cpu_ns(pid: int, tid: int) -> int:
    """CPU time (ns) a thread has used: schedstat's run time, else utime + stime."""
    task = PROC / str(pid) / "task" / str(tid)
    text = _read(task / "schedstat")
    if text:
        return int(text.split()[0])
    return _ticks_ns(_read(task / "stat"))


@dataclass(frozen=True)
class CpuMark:
    """CPU used so far by a worker's threads (ns, schedstat precision), and by its threads that
    already exited (ns, clock-tick precision: the process total less its live threads)."""

    threads_ns: dict[int, int]
    exited_ns: int
    slack_ns: int
    """Rounding of exited_ns: a tick per live thread and one for the total."""
    runnable: frozenset[int]
    """Threads running or waiting for a CPU (state R): a preempted spinner uses no CPU for a
    while but is not idle."""

    @classmethod
    def take(cls, pid: int) -> CpuMark:
        tids = thread_ids(pid)
        task = PROC / str(pid) / "task"
        stats = {tid: _read(task / str(tid) / "stat") for tid in tids}
        live = sum(_ticks_ns(text) for text in stats.values())
        return cls(
            {tid: thread_cpu_ns(pid, tid) for tid in tids},
            _ticks_ns(_read(PROC / str(pid) / "stat")) - live,
            (len(tids) + 1) * TICK_NS,
            frozenset(t for t, text in stats.items() if text[text.rfind(")") + 2 :][:1] == "R"),
        )

    def used_since(self, earlier: CpuMark, tids: set[int]) -> dict[int, int]:
        """CPU (ns) each of `tids` used since `earlier` (from 0 for a thread born since)."""
        return {t: self.threads_ns.get(t, 0) - earlier.threads_ns.get(t, 0) for t in tids}

    def exited_since(self, earlier: CpuMark) -> int:
        """CPU (ns) of threads that exited since `earlier`, beyond rounding."""
        return max(0, self.exited_ns - earlier.exited_ns - max(self.slack_ns, earlier.slack_ns))


class ProcessWatch:
    """Counts the worker's threads and the sandbox's other live processes."""

    def __init__(self, anchor_pid: int, marker: str, *, background: bool = False) -> None:
        self.anchor = anchor_pid
        self.marker = marker
        self.background = background
        """The task allows work between calls: threads are neither counted nor measured."""
        own = _pid_ns(os.getpid())
        ns = _pid_ns(anchor_pid) if anchor_pid > 0 else None
        self.namespace = ns if ns is not None and ns != own else None
        self.visible = anchor_pid > 0 and (PROC / str(anchor_pid)).exists()
        self.method = "pidns" if self.namespace else "tree" if self.visible else "self-report"
        """How leftovers are found: 'pidns', 'tree' (process tree + session) or 'self-report'
        (the worker's own count: the harness cannot see it)."""
        self.start_threads: int | None = None
        self.start_tids: set[int] | None = None
        """Thread ids alive when the worker first answered, before any candidate code ran: every
        other thread was started by candidate code (or a library it called)."""
        self.base_members: set[int] | None = None
        """Sandbox processes once the worker answered its first request, before any candidate
        code ran: the only processes besides the worker allowed to exist afterwards."""
        self.worker_pid: int | None = None
        self.pool_threads = 0
        """Most pool threads the worker's torch reported: how many threads started by candidate
        code are tolerated (untrusted: it only admits threads that are then measured idle)."""
        self.tolerated: set[int] = set()
        """Threads started by candidate code, found idle after a call: compute-pool threads."""
        self._mark: CpuMark | None = None

    def started(self, reported_threads: int = 0) -> None:
        """Call once the worker first answered, before preloads and before candidate code runs.
        If the worker lives in a PID namespace of its own (bubblewrap runs it below the anchor),
        watch that namespace: orphans of a double fork stay in it."""
        worker = self._worker(self.members())
        if self.namespace is None and worker is not None:
            ns = _pid_ns(worker)
            if ns is not None and ns != _pid_ns(os.getpid()):
                self.namespace, self.method = ns, "pidns"
        self.base_members = self.members()
        worker = self._worker(self.base_members)
        if self.method == "self-report" or worker is None:
            self.start_threads = reported_threads
            return
        self.start_tids = thread_ids(worker)
        self.start_threads = len(self.start_tids)

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

    def summary(self) -> dict[str, object]:
        """What the watch saw, for the experiment's evidence: how it looked, the threads alive
        when the worker started, and the later threads it let pass because they were idle."""
        return {
            "method": self.method,
            "threads_at_start": self.start_threads,
            "idle_pool_threads_tolerated": len(self.tolerated),
            "pool_threads_allowed": self.pool_threads,
            "background_allowed": self.background,
        }

    def problem(self, reported_threads: int = 0, pool_threads: int = 0) -> str | None:
        """Why the sandbox is not back at rest after a call, or None. Call right after the call
        returned; `pool_threads`: how many threads the worker says torch's pools hold."""
        self._mark = None
        self.pool_threads = max(self.pool_threads, pool_threads)
        if self.method == "self-report":
            started = self.start_threads or 1
            if not self.background and reported_threads > started + self.pool_threads:
                extra = reported_threads - started
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
        if worker is None or self.start_tids is None or self.background:
            return None
        new = thread_ids(worker) - self.start_tids
        if len(new) > self.pool_threads:
            return (
                f"candidate left {len(new)} thread(s) running after the call returned "
                f"(started by candidate code, at import, warm-up or since; "
                f"{self.pool_threads} compute-pool threads allowed)"
            )
        return self._settle(worker, new)

    def _settle(self, worker: int, new: set[int]) -> str | None:
        """Wait until the new threads sleep and stop using CPU (an OpenMP spin-wait ends within a
        few ms). A thread that used more than SPIN_LIMIT_S of CPU since the return, or still uses
        CPU SETTLE_S after it, is work left running: CPU used, not wall time, so that a thread
        waiting for a CPU on a loaded machine is not taken for one at work. Settled threads are
        tolerated as idle pool threads; from here until the next call every thread but the
        worker's own is measured (`before_request`)."""
        start = mark = CpuMark.take(worker)
        began = time.monotonic()
        while new:
            time.sleep(POLL_S)
            later = CpuMark.take(worker)
            grew = sum(later.used_since(mark, new).values()) + later.exited_since(mark)
            mark = later
            if max(later.used_since(start, new).values()) > SPIN_LIMIT_S * 1e9:
                return self._busy(start, later, new, "while settling after")
            if grew == 0 and not later.runnable & new:
                break
            if time.monotonic() - began > SETTLE_S:
                if grew:
                    return self._busy(start, later, new, f"still, {SETTLE_S:g} s after")
                break  # runnable, waiting for a CPU: not work
        self.tolerated |= new
        self._mark = mark
        return None

    def before_request(self, *, call: bool = True) -> str | None:
        """Why threads other than the worker's own worked since the last call returned (once
        settled); call before each request. None when they stayed idle. The measurement runs
        from one call to the next: puts in between do not reset it."""
        mark = self._mark
        if call:
            self._mark = None
        if mark is None or self.worker_pid is None:
            return None
        later = CpuMark.take(self.worker_pid)
        others = set(later.threads_ns) - {self.worker_pid}
        cpu = sum(later.used_since(mark, others).values()) + later.exited_since(mark)
        if cpu <= IDLE_CPU_LIMIT_S * 1e9:
            return None
        return self._busy(mark, later, others, "between calls, after")

    def _busy(self, mark: CpuMark, later: CpuMark, tids: set[int], when: str) -> str | None:
        used = later.used_since(mark, tids)
        exited = later.exited_since(mark)
        busiest = sorted(used.items(), key=lambda item: -item[1])[:3]
        named = ", ".join(f"{tid} ({ns / 1e6:.0f} ms)" for tid, ns in busiest if ns > 0)
        if exited:
            named = ", ".join(filter(None, [named, f"exited threads ({exited / 1e6:.0f} ms)"]))
        cpu = sum(used.values()) + exited
        return (
            f"candidate left work running on a background thread: {cpu / 1e6:.0f} ms of CPU "
            f"{when} the call returned (idle pool threads use none; busiest: {named})"
        )


def _own_session() -> int:
    return os.getsid(0)
