"""The private copy of a workspace: a temporary folder per sandbox, removed on cleanup.

Layout of `<tmp>/infra-agent-sandbox-<pid>-<random>/`:
- `ws/`: the copy of the workspace, owned by the uid sandboxed code runs as;
- `state/`: host-only files (captured stdout/stderr), never visible inside the sandbox.
The owning pid in the name lets `sweep_stale` remove folders of processes that were SIGKILLed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from infra_agent.sandboxes.proctree import alive

PREFIX = "infra-agent-sandbox-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


class PrivateCopy:
    """A workspace copy plus a host-only state folder."""

    def __init__(self, source: Path, *, owner_uid: int | None) -> None:
        if not source.is_dir():
            raise FileNotFoundError(f"workspace {source} is not a folder")
        sweep_stale()
        self.top = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")).resolve()
        self.top.chmod(0o711)  # others may traverse to ws/, not list or read state/
        self.root = self.top / "ws"
        self.state = self.top / "state"
        self.owner_uid = owner_uid
        shutil.copytree(source, self.root, symlinks=True)
        self.state.mkdir(mode=0o700)
        self.fix_ownership()

    def fix_ownership(self) -> None:
        """Give the sandbox uid everything in the copy (files the host wrote since included)."""
        if self.owner_uid is None:
            return
        uid = self.owner_uid
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in [*dirnames, *filenames, ""]:
                path = os.path.join(dirpath, name) if name else dirpath
                if os.lstat(path).st_uid != uid:
                    os.lchown(path, uid, uid)

    def remove(self, relpath: Path) -> bool:
        """Delete a path of the copy (a hidden path inside the workspace). True if it existed."""
        target = self.root / relpath
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
            return True
        if target.exists() or target.is_symlink():
            target.unlink()
            return True
        return False

    def destroy(self) -> None:
        shutil.rmtree(self.top, ignore_errors=True)


def sweep_stale(tmp: Path | None = None) -> int:
    """Remove sandbox folders whose owning process is gone. Returns how many were removed."""
    base = tmp or Path(tempfile.gettempdir())
    removed = 0
    try:
        entries = list(base.iterdir())
    except OSError:
        return 0
    for entry in entries:
        match = _NAME.match(entry.name)
        if match is None or alive(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed += 1
    return removed
