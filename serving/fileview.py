"""What the server sees of the file system: system folders and the paths it needs, nothing else.

A source patch runs inside the server, so the server is started under bubblewrap with a view
built from an allow-list, the same way the local sandbox builds one (`sandboxes.confinement`):

    view = choose("confined")                  # FileView(mode="confined") or host + reason
    argv = wrap(argv, view, shown=[...], writable=workdir, isolate_network=True, gpu=False)

Inside: /usr, /lib*, /bin, a few /etc files, /sys, the interpreters' prefixes, each path in
`shown` (the SGLang environment, the model, the source overlay, the kernel shim, paths named in
the command, the deployment's `readable_paths`) read-only, the server's workdir read-write, a
private /tmp, its own /proc and /dev (only the NVIDIA device nodes are passed through when it
uses GPUs), no capabilities. Home folders, /run and /var (the Docker socket, other programs'
UNIX sockets), the run store, the configuration with its API keys and the rest of /tmp are not
there. With `isolate_network`, bubblewrap also gives the server its own network namespace with
only a loopback (`netns` joins it from the driver: `netns.open_namespace` finds the process that
entered it, bubblewrap's child).

Without bubblewrap the server sees the whole file system and says so (`FileView.render`:
"host (unconfined: <reason>)"); the network namespace then comes from `netns.confine`.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from infra_agent.sandboxes.confinement import ETC_FILES, GPU_DEVICES, ROOT_DIRS, python_paths
from infra_agent.serving import netns

FileSystemMode = Literal["confined", "host"]


class FileView(BaseModel):
    """The server's view of the file system."""

    mode: FileSystemMode
    reason: str | None = None
    """Why the server sees the host's file system (mode 'host'), or None."""
    shown: list[str] = Field(default_factory=list)
    """Host paths shown read-only besides the system folders (set by `wrap`)."""
    writable: str | None = None
    """The one host folder the server may write (its workdir; set by `wrap`)."""

    def render(self) -> str:
        if self.mode == "confined":
            return (
                f"confined (bubblewrap: system folders and {len(self.shown)} paths read-only, "
                "workdir writable, private /tmp, home, /run and /var hidden)"
            )
        return f"host (unconfined: {self.reason})"


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why bubblewrap cannot confine the server here, or None when it can (checked once)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    smallest = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]
    return netns.probe_failure(smallest, "bwrap")


def choose(requested: FileSystemMode) -> FileView:
    """The view a server gets: the requested one, or host with the reason confinement failed."""
    if requested == "host":
        return FileView(mode="host", reason="the deployment sets filesystem = 'host'")
    reason = unavailable()
    return FileView(mode="host", reason=reason) if reason else FileView(mode="confined")


def paths_named(argv: Iterable[str]) -> list[Path]:
    """Existing absolute paths in a command line (`--flag=/path` included); a Python
    interpreter of a virtual environment stands for the whole environment."""
    found = []
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if not value.startswith("/") or not os.path.exists(value):
            continue
        path = Path(value)
        venv = path.parent.parent
        if path.parent.name == "bin" and (venv / "pyvenv.cfg").is_file():
            path = venv
        found.append(path)
    return found


def wrap(
    argv: list[str],
    view: FileView,
    *,
    shown: Iterable[Path],
    writable: Path,
    isolate_network: bool,
    gpu: bool,
) -> list[str]:
    """`argv` under bubblewrap with the view above; records the paths in `view`."""
    shown = [Path(p) for p in shown if os.path.exists(p)]
    args = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--cap-drop", "ALL"]
    args += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if isolate_network:
        args.append("--unshare-net")  # bubblewrap brings the loopback up itself
    for path in ROOT_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev", "--ro-bind", "/sys", "/sys", "--tmpfs", "/tmp"]
    if gpu:
        for node in [*GPU_DEVICES, *sorted(glob.glob("/dev/nvidia[0-9]*"))]:
            args += ["--dev-bind-try", node, node]
    for path in ETC_FILES:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    visible = sorted({*python_paths(shown), *shown} - {writable})
    # Parents before children: a later bind of a parent would hide a child's bind.
    binds = sorted([(p, "--ro-bind") for p in visible] + [(writable, "--bind")],
                   key=lambda bind: len(bind[0].parts))  # fmt: skip
    for folder, how in binds:
        args += [how, str(folder), str(folder)]
    args += ["--chdir", str(writable), "--"]
    view.shown = [str(p) for p in visible]
    view.writable = str(writable)
    return [*args, *argv]
