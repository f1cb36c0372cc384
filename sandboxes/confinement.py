"""The command line that confines one local command: bubblewrap, else `unshare`, else nothing.

With bubblewrap the sandboxed command sees a read-only root built from binds of what Python
needs (/usr, /lib*, a few /etc files, the interpreter prefix and the virtual environment, the
caller's read-only paths), the workspace copy read-write at its host path, a private /tmp, its
own /proc and /dev, no network (unless asked), and its own pid namespace: when the command's
init ends, the kernel kills everything left in it. Running as root, the command then drops to
an unprivileged uid of its own with `setpriv`, so RLIMIT_NPROC is enforced and root-owned files stay
read-only. Each step records the isolation it gives in `Confinement.in_force`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from infra_agent.sandboxes.base import SandboxSpec

UID_RANGE = (200_000, 300_000)
"""Sandboxed commands run as a uid of their own from this range when the host process is root:
RLIMIT_NPROC counts per uid machine-wide, so a shared uid ('nobody') would make concurrent
sandboxes share one process budget, and could signal each other's processes."""


def allocate_uid() -> int | None:
    """A fresh unprivileged uid (= gid) for one sandbox, or None when not root (run as self)."""
    if os.geteuid() != 0:
        return None
    return UID_RANGE[0] + secrets.randbelow(UID_RANGE[1] - UID_RANGE[0])


ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/hosts",
    "/etc/ssl/certs",
    "/etc/alternatives",
)
ROOT_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
LO_UP = 'ip link set lo up && exec "$0" "$@"'
"""Run by sh in a new network namespace before the command replaces it ($0 "$@": its argv)."""
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def python_paths(extra: list[Path] | None = None) -> list[Path]:
    """Folders the interpreters need: this process's prefixes (base and virtual environment),
    and for each folder in `extra` that is a virtual environment (has pyvenv.cfg, e.g. the
    SGLang environment passed as a read-only path), the base installation it was made from."""
    paths = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}
    paths.add(Path(os.path.realpath(sys.executable)).parent.parent)
    for folder in extra or []:
        base = _venv_base(Path(folder))
        if base is not None:
            paths.add(base)
    return sorted(paths)


def _venv_base(folder: Path) -> Path | None:
    try:
        lines = (folder / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve().parent  # home is the base's bin/ folder
    return None


def bwrap_binary() -> str | None:
    return shutil.which("bwrap")


def unshare_binary() -> str | None:
    return shutil.which("unshare")


@dataclass
class Confinement:
    """A prefix for argv plus what it enforces."""

    prefix: list[str]
    in_force: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    pid_namespace: bool = False
    run_uid: int = field(default_factory=os.geteuid)
    """The uid the command really runs as."""
    shown: list[Path] = field(default_factory=list)
    """Host paths shown read-only besides the system folders (bubblewrap only)."""


def drop_privileges(uid: int | None) -> list[str]:
    """argv prefix dropping root to `uid` with no capabilities (nothing when `uid` is None)."""
    if uid is None:
        return []
    setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
    return [
        setpriv,
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


def bubblewrap(
    spec: SandboxSpec,
    *,
    workspace: Path,
    cwd: Path,
    hidden: list[Path],
    bwrap: str,
    uid: int | None,
    replaced: dict[Path, Path] | None = None,
    sysfs: bool = False,
) -> Confinement:
    """bubblewrap confinement for a command running in `cwd` (host path inside `workspace`).
    `replaced` (shown path -> host file) binds each file read-only over a file of a shown folder,
    so the one it covers is nowhere in the view; `sysfs` shows /sys read-only (not its cgroups)."""
    args = [bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--new-session"]
    c = Confinement(prefix=[], pid_namespace=True)
    if spec.network:
        c.in_force.append("net:host (spec.network=True: loopback and beyond not restricted)")
    else:
        args.append("--unshare-net")  # bubblewrap brings the loopback up
        c.in_force.append("netns:bwrap")
    c.in_force.append("pidns:bwrap")
    tree = _Tree(args)
    for path in ROOT_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
            tree.mounted.append(Path(path))
        elif os.path.isdir(path):
            tree.mount("--ro-bind", Path(path))
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]
    args += ["--perms", "1777", "--size", str(spec.file_size_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    # /tmp before the binds: a read-only path or the workspace may live under it
    tree.created.add(Path("/tmp"))  # a tmpfs: folders inside it can still be made
    for path in ETC_FILES:
        if os.path.exists(path):
            tree.mount("--ro-bind", Path(path))
    if sysfs or spec.gpus is not None:  # the CUDA driver reads PCI topology there
        args += ["--ro-bind-try", "/sys", "/sys", "--tmpfs", "/sys/fs/cgroup"]
    if spec.gpus is not None:
        gpu_nodes = [*GPU_DEVICES, *(f"/dev/nvidia{i}" for i in spec.gpus)]
        for node in gpu_nodes:
            args += ["--dev-bind-try", node, node]
        c.in_force.append(f"gpu:devices={','.join(map(str, spec.gpus))}")
    visible = [*python_paths(spec.readonly_paths), *spec.readonly_paths]
    shown = {Path(p) for p in visible if os.path.exists(p)} - {workspace}
    # Parents before children: a later bind of a parent would hide a child's bind.
    binds = sorted([(p, "--ro-bind") for p in shown] + [(workspace, "--bind")],
                   key=lambda bind: len(bind[0].parts))  # fmt: skip
    for folder, how in binds:
        tree.mount(how, folder)
    for target, source in sorted((replaced or {}).items()):
        args += ["--ro-bind", str(source), str(target)]
    if replaced:
        c.in_force.append(f"replaced:{len(replaced)} files (the originals are not in the view)")
    shadowed = 0
    for secret in hidden:
        if not _under_any(secret, [Path(root) for root in ROOT_DIRS] + visible + [workspace]):
            continue  # never bound, so already invisible
        if secret.is_dir():
            args += ["--tmpfs", str(secret)]
        elif secret.exists():
            args += ["--ro-bind", "/dev/null", str(secret)]
        shadowed += 1
    args += ["--remount-ro", "/", "--chdir", str(cwd)]
    c.in_force += ["fs:readonly-root", "tmp:private", f"hidden:{len(hidden)} paths"]
    if shadowed:
        c.in_force.append(f"hidden:{shadowed} shadowed by tmpfs")
    c.run_uid = uid if uid is not None else os.geteuid()
    c.in_force.append(f"user:{c.run_uid}")
    c.prefix = [*args, "--", *drop_privileges(uid)]
    c.shown = sorted(shown)
    return c


def unshare(
    spec: SandboxSpec,
    *,
    hidden: list[Path],
    unshare_bin: str,
    uid: int | None,
    loopback: bool = False,
) -> Confinement:
    """Fallback when bubblewrap is missing (needs root): namespaces, no filesystem view.
    `loopback`: bring the new network namespace's loopback up (a server listens there)."""
    args = [unshare_bin, "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts"]
    c = Confinement(prefix=[], pid_namespace=True)
    if spec.network:
        c.in_force.append("net:host (spec.network=True: loopback and beyond not restricted)")
    else:
        args.append("--net")
        if loopback:  # before the privileges go: run by sh, which then becomes the command
            args += ["--", "sh", "-c", LO_UP]
        c.in_force.append("netns:unshare")
    c.in_force.append("pidns:unshare")
    c.missing += ["fs:readonly-root (no bubblewrap)", "tmp:private (no bubblewrap)"]
    if hidden:
        c.missing.append(f"hidden:{len(hidden)} paths outside the workspace (no bubblewrap)")
    if uid is not None and not _others_can_run(Path(os.path.realpath(sys.executable))):
        # Without bubblewrap's fresh root, an unprivileged uid could not even start Python.
        c.missing.append("user:unprivileged (the interpreter lies in a folder only root may enter)")
        uid = None
    c.run_uid = uid if uid is not None else os.geteuid()
    c.in_force.append(f"user:{c.run_uid}")
    c.prefix = [*args, *([] if args[-1] == LO_UP else ["--"]), *drop_privileges(uid)]
    return c


def unconfined(spec: SandboxSpec, *, hidden: list[Path]) -> Confinement:
    """No namespaces at all (neither tool usable): only rlimits, env scrub and process groups."""
    c = Confinement(prefix=[])
    if not spec.network:
        c.missing.append("netns (no bubblewrap, unshare needs root)")
    c.missing += ["pidns", "fs:readonly-root", "tmp:private"]
    if hidden:
        c.missing.append(f"hidden:{len(hidden)} paths outside the workspace")
    c.in_force.append(f"user:{os.geteuid()}")
    return c


class _Tree:
    """Adds binds to a bwrap argv, creating their parent folders world-traversable (0755):
    bubblewrap would create them 0700, unreadable once the command drops root."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self.mounted: list[Path] = []
        self.created: set[Path] = set()

    def mount(self, how: str, path: Path) -> None:
        for parent in reversed(path.parents[:-1]):  # "/" itself excluded
            if parent in self.created or _under_any(parent, self.mounted):
                continue  # made already, or inside a read-only bind where it exists
            self.args += ["--perms", "0755", "--dir", str(parent)]
            self.created.add(parent)
        self.args += [how, str(path), str(path)]
        self.mounted.append(path)


def _others_can_run(executable: Path) -> bool:
    """True if a uid that is neither owner nor group may traverse to and run `executable`."""
    for folder in executable.parents:
        if not os.stat(folder).st_mode & 0o001:
            return False
    return bool(os.stat(executable).st_mode & 0o001)


def _under_any(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)
