"""Finding and killing every process a sandbox started, including ones that left its group.

Each sandboxed process carries marker variables in its environment (`INFRA_AGENT_SANDBOX`, and
`INFRA_AGENT_SANDBOX_PROC` per command), inherited by everything it forks. Scanning /proc for
them finds processes that called setsid() or double-forked out of the process group. A process
that wipes its own environment escapes the scan, which is why the local backend also uses a pid
namespace (everything in it dies with its init) where bubblewrap or unshare is available.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from infra_agent.sandboxes.proctree import stat_fields

SANDBOX_VAR = "INFRA_AGENT_SANDBOX"
PROCESS_VAR = "INFRA_AGENT_SANDBOX_PROC"
PF_KTHREAD = 0x00200000
"""`/proc/PID/stat` flag of a kernel thread (whose environment always reads empty)."""

# PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. All
# sandboxed processes are therefore started from this one long-lived thread, so a caller's
# short-lived worker thread ending does not kill a still-needed RPC worker.
_launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-launcher")


def _new_launcher_after_fork() -> None:
    # A forked child has no launcher thread, but the inherited executor believes it has an
    # idle one: submitting would wait forever.
    global _launcher
    _launcher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-launcher")


os.register_at_fork(after_in_child=_new_launcher_after_fork)


def launch(argv: list[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **popen_kwargs)` from the launcher thread."""

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, **popen_kwargs)

    return _launcher.submit(start).result()


def marked_pids(
    variable: str, value: str, among: Callable[[], Iterable[int]] | None = None
) -> list[int]:
    """Host pids of live processes whose environment has `variable=value` (root sees all).

    `among` narrows the search to a known superset (a cgroup's members): reading every
    process's environment costs tens of ms on a busy machine.
    """
    return _scan(variable, value, among)[0]


def _scan(
    variable: str, value: str, among: Callable[[], Iterable[int]] | None
) -> tuple[list[int], list[int]]:
    """(marked pids, unsure pids). Unsure: a member of `among` whose environment reads empty,
    which is a process in the middle of an exec (the kernel sets the new environment's bounds
    only after loading the binary); a sandbox runs nothing with an empty environment."""
    needle = f"{variable}={value}".encode()
    found, unsure = [], []
    me = os.getpid()
    candidates = [str(pid) for pid in among()] if among is not None else os.listdir("/proc")
    for name in candidates:
        entry = Path("/proc") / name
        if not name.isdigit() or int(name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        if _is_zombie(entry):
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
        elif not environ and among is not None and not _is_kernel_thread(entry):
            unsure.append(int(entry.name))
    return found, unsure


def _is_zombie(entry: Path) -> bool:
    fields = stat_fields(int(entry.name))
    return fields is None or fields[0] in ("Z", "X")


def _is_kernel_thread(entry: Path) -> bool:
    fields = stat_fields(int(entry.name))
    return fields is None or bool(int(fields[6]) & PF_KTHREAD)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_marked(
    variable: str,
    value: str,
    *,
    among: Callable[[], Iterable[int]] | None = None,
    rounds: int = 20,
) -> int:
    """SIGKILL every process carrying the marker until none is left. Returns how many died."""
    killed: set[int] = set()
    for _ in range(rounds):
        # A process caught mid-exec shows no environment yet (a stray's `setsid sleep` once
        # went uncounted and unkilled that way under load): look again until it shows one.
        pids, unsure = _scan(variable, value, among)
        if not pids and not unsure:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    return len(killed)


def pids_with_cmdline(token: str) -> list[int]:
    """Live (non-zombie) host processes whose command line contains `token` (for checks that
    nothing a sandbox started survived, e.g. a sleeper with a unique duration)."""
    needle = token.encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle in cmdline and not _is_zombie(entry):
            found.append(int(entry.name))
    return found
