"""Per-process resource limits (setrlimit) applied in the child before it execs.

What each limit really does (recorded in `isolation()` as `rlimit:...`):
- RLIMIT_AS (`memory_mb`): address space, so `MemoryError`/ENOMEM once virtual memory passes it
  (stricter than resident memory: thread stacks and arenas count).
- RLIMIT_CPU (`cpu_time_s`): CPU seconds of each process; SIGXCPU, then SIGKILL.
- RLIMIT_FSIZE (`file_size_mb`): largest file a process may write; SIGXFSZ / EFBIG.
- RLIMIT_NPROC (`max_processes`): processes of the *real uid*, counted machine-wide, and never
  enforced for root. It only means something because sandboxed commands run as an unprivileged
  uid (see local.py); the pid namespace and the cgroup pids limit (where available) back it up.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Callable

from infra_agent.sandboxes.base import SandboxSpec

MIB = 1024 * 1024
MAX_OUTPUT_BYTES = 16 * MIB
"""stdout/stderr kept per `exec`; the rest is dropped (the file-size rlimit caps the files)."""
_PR_SET_PDEATHSIG = 1


def rlimits(spec: SandboxSpec) -> dict[int, int]:
    """setrlimit resource -> limit (soft = hard) for a spec."""
    found = {
        resource.RLIMIT_CPU: spec.cpu_time_s,
        resource.RLIMIT_FSIZE: spec.file_size_mb * MIB,
        resource.RLIMIT_NPROC: spec.max_processes,
    }
    if spec.limit_address_space:
        found[resource.RLIMIT_AS] = spec.memory_mb * MIB
    return found


def describe(spec: SandboxSpec, *, uid: int) -> tuple[list[str], list[str]]:
    """(limits in force, limits missing) in `isolation()` words, for commands running as `uid`."""
    in_force = [f"rlimit:as={spec.memory_mb}MiB"] if spec.limit_address_space else []
    in_force += [f"rlimit:cpu={spec.cpu_time_s}s", f"rlimit:fsize={spec.file_size_mb}MiB"]
    missing: list[str] = []
    if spec.cpus is not None:
        in_force.append(f"cpuset:{','.join(map(str, spec.cpus))} (affinity)")
    if uid == 0:
        missing.append("rlimit:nproc (not enforced for root)")
    else:
        in_force.append(f"rlimit:nproc={spec.max_processes} (per uid {uid})")
    return in_force, missing


def child_setup(spec: SandboxSpec, cgroup_procs: list[str] | None = None) -> Callable[[], None]:
    """A `preexec_fn`: join the sandbox's cgroup (its `cgroup.procs` files), apply the limits,
    pin to `spec.cpus` (inherited by everything it starts), and die with the parent
    (PR_SET_PDEATHSIG=SIGKILL). Small work only: no big allocations.
    """
    procs = list(cgroup_procs or [])
    cpus = set(spec.cpus or [])
    limits = list(rlimits(spec).items())
    libc = ctypes.CDLL(None, use_errno=True)

    def setup() -> None:
        for path in procs:
            with open(path, "w") as f:
                f.write("0")
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        for res, value in limits:
            # Never raise a hard limit that is already lower (unprivileged parents).
            _soft, hard = resource.getrlimit(res)
            if hard != resource.RLIM_INFINITY:
                value = min(value, hard)
            resource.setrlimit(res, (value, value))
        os.umask(0o022)
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def killed_reason(returncode: int) -> str | None:
    """The limit a signal exit points to, if any (SIGXCPU: cpu_time, SIGXFSZ: file_size)."""
    if returncode == -signal.SIGXCPU:
        return "cpu_time"
    if returncode == -signal.SIGXFSZ:
        return "file_size"
    return None


def signed_status(returncode: int) -> int:
    """Shell-style 128+N exit statuses back to -N (a signal), as subprocess reports them."""
    return -(returncode - 128) if 128 < returncode < 160 else returncode
