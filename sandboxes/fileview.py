"""What the server sees of the file system: system folders and the paths it needs, nothing else.

A source patch runs inside the server, so the server starts under bubblewrap with a view built
from an allow-list by the sandbox layer's own code (`sandboxes.confinement.bubblewrap`, put
together for a server by `serving.isolation`):

    view = choose("confined")                  # FileView(mode="confined") or host + reason

Inside: /usr, /lib*, /bin, a few /etc files, /sys (not its cgroups), the interpreters' prefixes,
each path the server needs (the SGLang environment, the model, the source overlay, the kernel
shim, paths named in the command, the deployment's `readable_paths`) read-only, each module the
arm changed bound over its installed original, the server's workdir read-write, a private /tmp
and /dev/shm, its own /proc and /dev (only the NVIDIA device nodes are passed through when it
uses GPUs). Home folders, /run and /var (the Docker socket, other programs' UNIX sockets),
infra-agent's package (tasks and their hidden files), the run store, the configuration with its
API keys and the rest of /tmp are not there.

Without bubblewrap the server sees the whole file system and says so (`FileView.render`:
"host (unconfined: <reason>)").
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from infra_agent.sandboxes import netns

FileSystemMode = Literal["confined", "host"]


class FileView(BaseModel):
    """The server's view of the file system."""

    mode: FileSystemMode
    reason: str | None = None
    """Why the server sees the host's file system (mode 'host'), or None."""
    shown: list[str] = Field(default_factory=list)
    """Host paths shown read-only besides the system folders."""
    writable: str | None = None
    """The one host folder the server may write (its workdir)."""

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
