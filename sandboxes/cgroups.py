"""A cgroup per confined command, where the host lets us make one: the escape-proof process list.

Every process a sandbox (or a confined server) starts joins its cgroup before exec and cannot
leave it (leaving needs write access to another cgroup). That gives: a memory limit on resident
memory (v1 `memory.limit_in_bytes`, v2 `memory.max`) with an OOM-kill counter, so a kill can be
named 'memory'; a pids limit for the whole group (independent of uids); a CPU set; the CPU time
of every process that ever ran in it (`cpu_seconds`, exited ones included); a freezer that stops
every member at once, however it was started (`freeze`/`thaw`); and a complete list of processes
to kill on cleanup. The cgroup is made under the caller's own cgroup, so the caller's limits
still apply. Where cgroups are read-only (rootless, some containers) `create` returns None and
the caller records 'cgroup' as missing; what this host lacks is left out of `limits`.

On a hybrid host (v1 controllers, cgroup2 at /sys/fs/cgroup/unified) the limits live in the v1
folders and the freezer, the kill and the CPU time in the v2 one: its core files
(`cgroup.freeze`, `cgroup.kill`, `cpu.stat`) need no controller, and a process frozen there
still dies of SIGKILL (one frozen by the v1 freezer would wait for a thaw that, after its owner
was killed, never comes).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "infra-agent-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")
V1_CONTROLLERS = ("memory", "pids", "cpuset", "cpuacct")
V2 = ""
"""The key of the cgroup2 folder in `Cgroup.folders`."""
FREEZE_WAIT_S = 10.0
"""How long `freeze` waits for every member to be frozen."""


class Cgroup:
    """One cgroup (v1: one folder per controller; v2: one folder, controller '')."""

    def __init__(self, folders: dict[str, Path], limits: list[str]) -> None:
        self.folders = folders
        """Controller -> its folder ('' for cgroup v2)."""
        self.limits = limits
        """What is enforced, in `isolation()` words, e.g. 'cgroup:memory=4096MiB'."""

    @classmethod
    def create(
        cls, name: str, *, memory_mb: int, max_processes: int, cpus: list[int] | None = None
    ) -> Cgroup | None:
        """Make `<own cgroup>/infra-agent-<pid>-<name>` with the limits (`cpus`: the CPU set,
        None for the parent's); None if not writable."""
        folders: dict[str, Path] = {}
        limits: list[str] = []
        leaf = f"{PREFIX}{os.getpid()}-{name}"
        own = _own_cgroups()
        for controller, parent in own.items():
            # The limits are the point; a CPU set, freezer or CPU clock this host refuses is not.
            essential = controller in ("memory", "pids") or "memory" not in own
            _sweep(parent)
            folder = parent / leaf
            try:
                folder.mkdir()
                folders[controller] = folder
                limits += _set_limits(folder, controller, memory_mb, max_processes, cpus)
            except OSError:
                if essential:
                    Cgroup(folders, []).remove()
                    return None
                Cgroup({controller: folders.pop(controller, folder)}, []).remove()
        return cls(folders, limits) if folders else None

    def join_file_paths(self) -> list[str]:
        """cgroup.procs files a child writes its pid to (from `preexec_fn`) before exec."""
        return [str(folder / "cgroup.procs") for folder in self.folders.values()]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for folder in self.folders.values():
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def cpu_seconds(self) -> float | None:
        """CPU seconds used by every process that ran in the cgroup (None: no CPU accounting)."""
        if V2 in self.folders:
            for line in _read(self.folders[V2] / "cpu.stat").splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        if "cpuacct" in self.folders:
            return int(_read(self.folders["cpuacct"] / "cpuacct.usage") or 0) / 1e9
        return None

    @property
    def can_freeze(self) -> bool:
        """True where the cgroup has a freezer (cgroup2's `cgroup.freeze`)."""
        return V2 in self.folders and (self.folders[V2] / "cgroup.freeze").exists()

    def freeze(self) -> None:
        """Stop every member, and whatever it starts meanwhile, until `thaw`; returns once the
        kernel reports all frozen. TimeoutError if that takes over FREEZE_WAIT_S."""
        if not self.can_freeze:
            raise OSError("this cgroup has no freezer")
        (self.folders[V2] / "cgroup.freeze").write_text("1")
        deadline = time.monotonic() + FREEZE_WAIT_S
        while not self.frozen():
            if time.monotonic() > deadline:
                raise TimeoutError(f"cgroup {self.folders[V2]} did not freeze")
            time.sleep(0.005)

    def thaw(self) -> None:
        if self.can_freeze:
            (self.folders[V2] / "cgroup.freeze").write_text("0")

    def frozen(self) -> bool:
        """True when every member is frozen (an empty cgroup asked to freeze counts)."""
        if not self.can_freeze:
            return False
        events = _read(self.folders[V2] / "cgroup.events").split()
        return "frozen" in events and events[events.index("frozen") + 1] == "1"

    def kill(self, *, rounds: int = 50) -> int:
        """SIGKILL every process in the cgroup until it is empty (frozen ones too). Returns how
        many were killed."""
        killed: set[int] = set()
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                break
            killed |= pids
            whole = self.folders.get(V2, Path("/-")) / "cgroup.kill"
            if whole.exists():  # one write, no race with a member forking meanwhile
                whole.write_text("1")
            else:
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        killed.discard(pid)
            time.sleep(0.02)
        return len(killed)

    def oom_kills(self) -> int:
        """Processes the kernel killed for exceeding the memory limit, so far."""
        for folder in self.folders.values():
            for name in ("memory.oom_control", "memory.events"):
                try:
                    text = (folder / name).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def remove(self) -> None:
        self.kill()
        for folder in self.folders.values():
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # dying processes still being released


def _own_cgroups() -> dict[str, Path]:
    """controller -> folder of this process's cgroup: the v1 V1_CONTROLLERS mounted here, and
    cgroup2 (V2) at the root (pure v2) or at `unified/` (hybrid)."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":
            for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
                if (root / "cgroup.controllers").exists():
                    found[V2] = root / rel
                    break
            continue
        for controller in controllers.split(","):
            if controller in V1_CONTROLLERS and (CGROUP_ROOT / controller).is_dir():
                found[controller] = CGROUP_ROOT / controller / rel
    return found


def _set_limits(
    folder: Path, controller: str, memory_mb: int, max_processes: int, cpus: list[int] | None
) -> list[str]:
    limits = []
    memory = str(memory_mb * 1024 * 1024)
    cpuset = ",".join(map(str, cpus)) if cpus else _read(folder.parent / "cpuset.cpus")
    writes = {
        "memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
        "pids": [("pids.max", str(max_processes))],
        # A v1 cpuset takes no process before it has CPUs and memory nodes.
        "cpuset": [("cpuset.mems", _read(folder.parent / "cpuset.mems")), ("cpuset.cpus", cpuset)],
        "cpuacct": [],
        # In a hybrid host's cgroup2 these files are absent (the controllers are v1's): skipped.
        V2: [("memory.max", memory), ("memory.swap.max", "0"), ("pids.max", str(max_processes))]
        + ([("cpuset.cpus", cpuset)] if cpus else []),
    }[controller]
    for name, value in writes:
        target = folder / name
        if not target.exists():
            continue
        try:
            target.write_text(value)
        except OSError:
            if name.startswith("memory.memsw") or name == "memory.swap.max":
                continue  # swap accounting off: the memory limit alone still holds
            raise
        if name in ("memory.limit_in_bytes", "memory.max"):
            limits.append(f"cgroup:memory={memory_mb}MiB")
        elif name == "pids.max":
            limits.append(f"cgroup:pids={max_processes}")
        elif name == "cpuset.cpus":
            limits.append(f"cgroup:cpuset={value}")
    if controller == V2 and (folder / "cgroup.freeze").exists():
        limits.append("cgroup:freezer")
    return limits


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _sweep(parent: Path) -> None:
    """Kill what is left in cgroups of sandboxes whose owner died without cleaning up (SIGKILL,
    or a process that escaped PR_SET_PDEATHSIG by racing its parent's death), remove them."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _NAME.match(entry.name)
        if match and not Path(f"/proc/{match.group(1)}").exists():
            Cgroup({V2: entry}, []).remove()


def container_procs_file(container: Any) -> Path | None:
    """The cgroup.procs file listing the container's processes (cgroup v1 pids/memory or v2)."""
    container.reload()
    pid = container.attrs["State"]["Pid"]
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in ("pids", "memory", ""):
            if controller in controllers.split(",") or controllers == controller == "":
                folder = Path("/sys/fs/cgroup") / controller / path.lstrip("/")
                if (folder / "cgroup.procs").exists():
                    return folder / "cgroup.procs"
    return None
