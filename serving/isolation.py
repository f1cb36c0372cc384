"""How a server is confined: the sandbox layer's confinement, applied to one server start.

A source patch runs inside the server, so the server is a candidate like any other and starts
under the same code as an arm's sandboxed commands (`sandboxes.confinement`, `cgroups`, `limits`):

    jail = confine(spec, argv, workdir=..., shown=[...], replaced={...}, hidden=[...], gpus=None)
    Popen([*jail.prefix, *argv], preexec_fn=jail.preexec())   # through sandboxes.processes.launch
    jail.record.render()                                      # what the server really had

- bubblewrap: its own pid namespace (it sees and can signal only its own processes: not the
  other arm's server, the harness or PID 1), its own network namespace with a loopback (`netns`),
  and a file view (`fileview`): system folders and the paths it needs read-only, its workdir
  writable, a private /tmp and /dev/shm, each module the arm changed bound over the installed
  original (`overlay.served_view`: the original and its bytecode are nowhere in the view),
  infra-agent's package and data folder (the run store) hidden.
- an unprivileged uid of its own (setpriv, no capabilities): no signal, ptrace, renice or
  re-pinning of any other process, no /proc/PID/mem or environ of another.
- rlimits (processes of its uid, CPU seconds, file size; no address-space limit: CUDA reserves
  far more than it uses) and a cgroup of its own: resident memory, pids, CPU set, the freezer
  `Server.pause` uses, the kill `Server.stop` uses, and the CPU clock of `Server.cpu_seconds`.

Without bubblewrap (or with `filesystem = 'host'`): `unshare` gives the namespaces but no file
view (and the uid only where an unprivileged one can reach the interpreter); without root
neither. Each missing piece is named in `ServerConfinement.missing`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from infra_agent.config import default_data_dir
from infra_agent.sandboxes import cgroups, confinement, fileview, limits, netns
from infra_agent.sandboxes.base import SandboxSpec
from infra_agent.serving.deployment import DeploymentSpec

PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""infra-agent itself (tasks, harnesses, references): hidden wherever it lies in a shown folder."""
MAX_PROCESSES = 4096
"""Processes and threads of the server's uid and cgroup (torch starts a thread per core)."""
CPU_TIME_S = 7 * 24 * 3600
"""RLIMIT_CPU per process: a server lives for one experiment; this only stops a runaway."""
FILE_SIZE_MB = 16 * 1024
"""RLIMIT_FSIZE: its log (stdout) counts too."""
MEMORY_SHARE = 0.8
"""The cgroup's resident-memory limit, as a share of the machine's memory: a runaway server
cannot take the harness's or the other arm's."""
Mode = Literal["bwrap", "unshare", "none"]


class ServerConfinement(BaseModel):
    """The confinement a server really had (stored in the evidence)."""

    mode: Mode
    uid: int
    """The uid the server's processes ran as."""
    pid_namespace: bool
    in_force: list[str]
    missing: list[str]

    def render(self) -> str:
        """One line, e.g. 'bwrap (pidns:bwrap, netns:bwrap, user:231117, cgroup:memory=...)'."""
        text = f"{self.mode} ({', '.join(self.in_force)})"
        return text + (f"; missing: {', '.join(self.missing)}" if self.missing else "")

    def as_evidence(self) -> tuple[list[str], list[str]]:
        """(isolation in force, missing) for the experiment's sandbox evidence: the patch of a
        serving task runs in its server, so this, not the arm's sandbox (which only holds the
        workspace copy the server's overlay is built from), is what confined it."""
        return [f"server:{self.mode}", *self.in_force, "workspace:arm-sandbox(files only)"], list(
            self.missing
        )


@dataclass
class Jail:
    """One server start's confinement: the argv prefix, the child setup, the cgroup."""

    record: ServerConfinement
    prefix: list[str]
    spec: SandboxSpec
    cgroup: cgroups.Cgroup | None
    wrappers: int
    """Processes of the confinement itself above the server's command (bwrap: 2, its monitor
    and the pid namespace's init; unshare: 1; none: 0)."""
    network: netns.Network
    filesystem: fileview.FileView

    def preexec(self) -> Callable[[], None]:
        """The child's setup before exec: join the cgroup, rlimits, die with the parent."""
        return limits.child_setup(self.spec, self.cgroup.join_file_paths() if self.cgroup else None)

    def close(self) -> None:
        """Kill what is left in the cgroup and remove it."""
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None


def confine(
    deployment: DeploymentSpec,
    name: str,
    *,
    workdir: Path,
    shown: list[Path],
    replaced: dict[Path, Path],
    hidden: list[Path],
    gpus: list[int] | None,
) -> Jail:
    """The confinement a server of `deployment` gets on this machine, and its cgroup `name`.
    `shown`: host paths it reads; `replaced`: shown path -> the file bound over it; `hidden`:
    paths never to be seen, even inside a shown folder. Chowns `workdir` to the server's uid."""
    network = netns.choose(deployment.network)
    view = fileview.choose(deployment.filesystem)
    mode: Mode = "bwrap" if view.mode == "confined" else "none"
    if mode == "none" and os.geteuid() == 0 and confinement.unshare_binary():
        mode = "unshare"
    if mode == "none" and network.mode == "isolated":
        network = netns.Network(mode="host", reason="neither bubblewrap nor unshare can confine")
    uid = confinement.allocate_uid() if deployment.filesystem == "confined" else None
    spec = SandboxSpec(
        network=network.mode == "host",
        memory_mb=_memory_mb(),
        limit_address_space=False,
        cpu_time_s=CPU_TIME_S,
        file_size_mb=FILE_SIZE_MB,
        max_processes=MAX_PROCESSES,
        gpus=gpus,
        readonly_paths=shown,
    )
    hidden = [PACKAGE_DIR, default_data_dir().resolve(), *hidden]
    if mode == "bwrap":
        c = confinement.bubblewrap(
            spec,
            workspace=workdir,
            cwd=workdir,
            hidden=hidden,
            bwrap=confinement.bwrap_binary() or "bwrap",
            uid=uid,
            replaced=replaced,
            sysfs=True,
        )
        view.shown = [str(p) for p in c.shown]
        view.writable = str(workdir)
        wrappers = 2
    elif mode == "unshare":
        c = confinement.unshare(
            spec,
            hidden=hidden,
            unshare_bin=confinement.unshare_binary() or "unshare",
            uid=uid,
            loopback=True,
        )
        wrappers = 1
    else:
        c = confinement.unconfined(spec, hidden=hidden)
        wrappers = 0
    if mode != "bwrap" and replaced:
        c.missing.append(f"replaced:{len(replaced)} originals of changed modules stay readable")
    if uid is not None and c.run_uid == uid:
        _adopt(workdir, uid)
    group = cgroups.Cgroup.create(name, memory_mb=spec.memory_mb, max_processes=MAX_PROCESSES)
    rl_force, rl_missing = limits.describe(spec, uid=c.run_uid)
    in_force, missing = [*c.in_force, *rl_force], [*c.missing, *rl_missing]
    if group is not None:
        in_force += group.limits
    else:
        missing.append("cgroup (not writable here): pause and stop reach only the process tree")
    if network.mode == "host":
        missing.append(f"netns ({network.reason})")
    if view.mode == "host":
        missing.append(f"file view ({view.reason})")
    record = ServerConfinement(
        mode=mode, uid=c.run_uid, pid_namespace=c.pid_namespace, in_force=in_force, missing=missing
    )
    return Jail(record, c.prefix, spec, group, wrappers, network, view)


def _adopt(workdir: Path, uid: int) -> None:
    """Give `workdir`, and what earlier servers left in it (their caches), to `uid`: each start
    has a uid of its own, and a cache folder of the last one would be read-only to the next."""
    os.chown(workdir, uid, uid)
    low, high = confinement.UID_RANGE
    for folder, dirs, files in os.walk(workdir):
        for name in [*dirs, *files]:
            path = os.path.join(folder, name)
            if low <= os.lstat(path).st_uid < high:
                os.lchown(path, uid, uid)


def _memory_mb() -> int:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(pages * MEMORY_SHARE) // (1024 * 1024)
