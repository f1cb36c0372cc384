"""Private files: what infra-agent writes about runs is readable by its user only.

The run store and its checkpoints, exports, approved-patch workspaces and argument files hold
prompts, code and measurements (and, in patches, whatever the agent wrote): files are 0600 and
folders 0700 whatever the process umask. SQLite creates its `-wal`/`-shm`/`-journal` side files
with the mode of the database file, so a database made private before SQLite opens it keeps its
side files private too. Subprocesses that write run data (git) run with `PRIVATE_UMASK`.

    private_sqlite(path)          # before sqlite3.connect(path)
    private_dir(folder)           # instead of folder.mkdir(parents=True, exist_ok=True)
    write_private(path, text)     # atomic, 0600
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
PRIVATE_UMASK = 0o077
"""For subprocesses writing run data: `subprocess.run(..., umask=PRIVATE_UMASK)`."""
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_dir(path: Path) -> Path:
    """`path` as a folder; each level created here is 0700 (existing folders are left as they
    are: a user's own folder is not ours to change)."""
    missing = []
    for level in [path, *path.parents]:
        if level.is_dir():
            break
        missing.append(level)
    for level in reversed(missing):
        try:
            level.mkdir(mode=DIR_MODE)
        except FileExistsError:
            if not level.is_dir():
                raise
            continue
        os.chmod(level, DIR_MODE)  # mkdir's mode passes through the umask
    return path


def private_file(path: Path) -> Path:
    """`path` as an existing 0600 file (created empty if missing, in a private folder).

    An existing file is changed by name, never opened: closing a descriptor of a file drops
    every POSIX lock this process holds on it, SQLite's included (a store open in another thread
    would lose its locks)."""
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, FILE_MODE)
    except FileExistsError:
        pass
    else:
        os.close(fd)
    os.chmod(path, FILE_MODE)  # the umask may have taken bits away; an old file may have more
    return path


def private_sqlite(path: Path) -> Path:
    """Make the SQLite database at `path` and its existing side files 0600 before it is opened
    (SQLite gives new side files the database file's mode)."""
    private_file(path)
    for suffix in SQLITE_SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.chmod(side, FILE_MODE)
    return path


def make_tree_private(root: Path) -> None:
    """Drop group and other permissions on `root` and everything under it (symlinks untouched):
    for a tree copied or written by tools that follow the umask (shutil, git)."""
    for folder, dirs, files in os.walk(root):
        os.chmod(folder, DIR_MODE)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode & 0o700 | 0o600)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` atomically as a 0600 file (in a private folder)."""
    private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
