"""A confined command's processes, held together: frozen, counted and killed as one.

The cgroup is the command: `pause()` freezes every process in it until `resume()` (nothing the
command started runs meanwhile, however it was started), `cpu_seconds()` is the CPU time of
everything that ran in it, and `terminate()` sends SIGTERM, waits, then kills the whole cgroup
and waits until none is alive (the confinement's own processes too). A process in the cgroup
outside the command's process tree (double-forked, orphaned: reparented to the namespace's init)
is a violation, named in `violations`; `find_strays` records it. Without a writable cgroup,
pause, terminate and the CPU time fall back to the process tree (`sandboxes/proctree.py`).

    group = ConfinedProcesses(proc, cgroup, wrappers=2, owner="server")
    group.pause(); group.resume(); group.cpu_seconds(); group.terminate(timeout_s=30, alone=True)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from infra_agent.sandboxes import cgroups, proctree


def kill(pid: int, sig: int) -> None:
    """Send `sig` to `pid`; a process already gone is no error."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class ConfinedProcesses:
    """The processes of one confined command `proc`: its cgroup, or its process tree without
    one. `wrappers`: processes of the confinement itself above the command (bubblewrap: 2, its
    monitor and the pid namespace's init; unshare: 1; none: 0). `owner` names the command in the
    violation sentences ("left the {owner}'s process tree")."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        cgroup: cgroups.Cgroup | None,
        *,
        wrappers: int,
        owner: str,
    ) -> None:
        self.proc = proc
        self.cgroup = cgroup
        self.wrappers = wrappers
        self.owner = owner
        self.violations: list[str] = []
        """Processes found outside the command's process tree (each a sentence)."""
        self._strays: dict[int, int] = {}
        """Their pids, each to its sentence's place: one sentence per process, naming its latest
        command line (a stray seen between its fork and its exec still shows its parent's)."""
        self.paused = False
        """True between `pause()` and `resume()`."""
        self._known: set[int] = set()

    def note_tree(self) -> None:
        """Remember the command's current tree (stop reaches them even after they left it)."""
        self._known |= proctree.descendants(self.proc.pid)

    def pause(self) -> None:
        """Stop every process (the cgroup frozen, else SIGSTOP to the tree): they take no CPU
        until `resume()`."""
        if self.paused:
            return
        self.paused = True
        group = self.cgroup
        if group is not None and group.can_freeze:
            group.freeze()
        else:
            self._known |= proctree.freeze(self.proc.pid)
        self.find_strays()

    def stopped(self) -> bool:
        """True when the kernel reports every process stopped (the cgroup frozen, else each
        process of the tree in state T)."""
        group = self.cgroup
        if group is not None and group.can_freeze:
            return group.frozen()
        states = {(proctree.stat_fields(p) or ["X"])[0] for p in self.processes()}
        return bool(states) and states <= {"T", "t"}

    def resume(self) -> None:
        """Continue paused processes."""
        if not self.paused:
            return
        group = self.cgroup
        if group is not None and group.can_freeze:
            group.thaw()
        else:
            proctree.thaw(self.proc.pid)
        self.paused = False

    @contextmanager
    def placed_on(self, cpu: int) -> Iterator[bool]:
        """Every thread of the command held on `cpu` for the block, then given its CPU set back.
        A busy process stays where the block left it (the kernel moves a thread only to balance
        load), so what runs after the block starts from the same placement whichever core the
        command ran on before; left alone, a busy process keeps the core it first got for the
        command's whole life, a lasting handicap against another command on a machine whose
        cores differ in speed or in what else runs there. Yields False where a thread could not
        be moved (no right to, or `cpu` outside its set): it runs where the kernel puts it."""
        held: dict[int, set[int]] = {}
        moved = True
        try:
            for pid in self.processes():
                for tid in proctree.threads(pid):
                    try:
                        allowed = os.sched_getaffinity(tid)
                        if cpu not in allowed:
                            moved = False
                            continue
                        os.sched_setaffinity(tid, {cpu})
                        held[tid] = allowed
                    except ProcessLookupError:
                        continue  # the thread ended meanwhile
                    except PermissionError:
                        moved = False
            yield moved
        finally:
            for tid, allowed in held.items():
                try:
                    os.sched_setaffinity(tid, allowed)
                except (ProcessLookupError, PermissionError):
                    pass

    def processes(self) -> set[int]:
        """The command's live processes (not its confinement's own)."""
        group = self.cgroup
        if group is None:
            return proctree.tree(self.proc.pid)
        return {p for p in group.pids() - self.layout()[0] if proctree.alive(p)}

    def cpu_seconds(self) -> float:
        """CPU seconds used so far (the cgroup: every process that ran in it; else the tree and
        the children it reaped)."""
        group = self.cgroup
        used = group.cpu_seconds() if group is not None else None
        return used if used is not None else proctree.cpu_seconds(self.processes())

    def layout(self) -> tuple[set[int], int | None]:
        """(the confinement's own processes above the command, the command's pid or None before
        it started): bubblewrap's monitor and namespace init, then the oldest child."""
        depth = self.wrappers
        group = self.cgroup
        pids = group.pids() if group is not None else proctree.tree(self.proc.pid)
        chain = proctree.lineage(pids | {self.proc.pid}, self.proc.pid, depth)
        return set(chain[:depth]), chain[depth] if len(chain) > depth else None

    def find_strays(self) -> list[int]:
        """Processes in the cgroup outside the command's process tree (double-forked or
        orphaned: reparented to the namespace's init); each is recorded in `violations`."""
        group = self.cgroup
        wrappers, command = self.layout()
        if group is None or command is None:
            return []
        strays = sorted(proctree.outside_tree(group.pids() - wrappers, command))
        for pid in strays:
            line = proctree.command_line(pid)[:120]
            if pid in self._strays and not line:  # exited meanwhile: keep what it was
                continue
            sentence = (
                f"process {pid} ({line!r}) left the {self.owner}'s "
                "process tree (a double fork or an orphan); its cgroup held it: frozen with the "
                f"{self.owner} when paused, killed at stop"
            )
            if pid in self._strays:
                self.violations[self._strays[pid]] = sentence
            else:
                self._strays[pid] = len(self.violations)
                self.violations.append(sentence)
        return strays

    def terminate(self, timeout_s: float, *, alone: bool) -> int:
        """Stop the command and every process it started: strays are killed first, then SIGTERM
        (to the command only when `alone`: in its own pid namespace it shuts its processes down
        itself and the namespace ends with it), `timeout_s` to exit, then SIGKILL to whatever
        is left. Returns when every process is gone (the confinement's own included), with how
        many needed SIGKILL."""
        pid = self.proc.pid
        group = self.cgroup
        strays = self.find_strays()
        for p in strays:  # frozen or not, they never run again
            kill(p, signal.SIGKILL)
        wrappers, command = self.layout()
        members = self.processes() | (self._known - wrappers) - set(strays)
        everything = proctree.tree(pid) | members | wrappers  # the confinement's own included
        for p in {command} if alone and command is not None else members:
            kill(p, signal.SIGTERM)
        if self.paused:  # a stopped process holds SIGTERM until it runs again
            self.resume()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.proc.poll()
            members |= self.processes()
            if not any(proctree.alive(p) for p in members):
                break
            time.sleep(0.2)
        stubborn = [p for p in members | self.processes() if proctree.alive(p)]
        if group is not None:
            group.kill()
        else:
            _signal_group(pid, signal.SIGKILL)
            for p in stubborn + sorted(proctree.descendants(pid)):
                kill(p, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print(f"warning: {self.owner} pid {pid} did not exit after SIGKILL", file=sys.stderr)
        deadline = time.monotonic() + 10  # returns when every process is gone (wrappers too)
        while any(proctree.alive(p) for p in everything) and time.monotonic() < deadline:
            time.sleep(0.1)
        for p in everything:
            if proctree.alive(p):
                kill(p, signal.SIGKILL)
        return len(stubborn)
