"""A cgroup per local sandbox, where the host lets us make one: the escape-proof process list.

Every process a sandbox starts joins its cgroup before exec and cannot leave it (leaving needs
write access to another cgroup). That gives: a memory limit on resident memory (v1
`memory.limit_in_bytes`, v2 `memory.max`) with an OOM-kill counter, so a kill can be named
'memory'; a pids limit for the whole sandbox (independent of uids); and a complete list of
processes to kill on cleanup. The cgroup is made under the caller's own cgroup, so the caller's
limits still apply. Where cgroups are read-only (rootless, some containers) `create` returns None
and the sandbox records 'cgroup' as missing.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PREFIX = "infra-agent-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


class Cgroup:
    """One cgroup (v1: one folder per controller; v2: one folder)."""

    def __init__(self, folders: list[Path], limits: list[str]) -> None:
        self.folders = folders
        self.limits = limits
        """What is enforced, in `isolation()` words, e.g. 'cgroup:memory=4096MiB'."""

    @classmethod
    def create(cls, name: str, *, memory_mb: int, max_processes: int) -> Cgroup | None:
        """Make `<own cgroup>/infra-agent-<pid>-<name>` with the limits; None if not writable."""
        folders: list[Path] = []
        limits: list[str] = []
        leaf = f"{PREFIX}{os.getpid()}-{name}"
        try:
            for controller, parent in _own_cgroups().items():
                _sweep(parent)
                folder = parent / leaf
                folder.mkdir()
                folders.append(folder)
                limits += _set_limits(folder, controller, memory_mb, max_processes)
        except OSError:
            Cgroup(folders, []).remove()
            return None
        return cls(folders, limits) if folders else None

    def join_file_paths(self) -> list[str]:
        """cgroup.procs files a child writes its pid to (from `preexec_fn`) before exec."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for folder in self.folders:
            try:
                found |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return found

    def kill(self, *, rounds: int = 50) -> int:
        """SIGKILL every process in the cgroup until it is empty. Returns how many were killed."""
        killed: set[int] = set()
        for _ in range(rounds):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        return len(killed)

    def oom_kills(self) -> int:
        """Processes the kernel killed for exceeding the memory limit, so far."""
        for folder in self.folders:
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
        for folder in self.folders:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # dying processes still being released


def _own_cgroups() -> dict[str, Path]:
    """controller -> folder of this process's cgroup: v1 'memory' and 'pids', or v2 ''."""
    found: dict[str, Path] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "" and (CGROUP_ROOT / "cgroup.controllers").exists():
            return {"": CGROUP_ROOT / rel}  # pure v2
        for controller in controllers.split(","):
            if controller in ("memory", "pids") and (CGROUP_ROOT / controller).is_dir():
                found[controller] = CGROUP_ROOT / controller / rel
    return found


def _set_limits(folder: Path, controller: str, memory_mb: int, max_processes: int) -> list[str]:
    limits = []
    memory = str(memory_mb * 1024 * 1024)
    writes = {
        "memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
        "pids": [("pids.max", str(max_processes))],
        "": [("memory.max", memory), ("memory.swap.max", "0"), ("pids.max", str(max_processes))],
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
    return limits


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
            Cgroup([entry], []).remove()
