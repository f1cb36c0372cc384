"""The sandbox interface: where candidate code runs, isolated from the network, secrets, the
harness and the rest of the machine.

A sandbox is created from a workspace folder (copied privately), can have a patch applied, runs
commands with a timeout that kills everything they started, reads and writes files inside the
copy, and is always cleaned up (use it as a context manager).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from pydantic import BaseModel, Field


class SandboxSpec(BaseModel):
    """What the caller asks for. Backends record what they could actually enforce."""

    network: bool = False
    """Allow network access (never for candidate code)."""
    memory_mb: int = 4096
    """Address-space / memory limit in MiB."""
    limit_address_space: bool = True
    """Apply `memory_mb` to the address space too (RLIMIT_AS); False leaves only the cgroup's
    resident-memory limit (a CUDA process reserves far more address space than it uses)."""
    cpu_time_s: int = 600
    """CPU-time limit in seconds (RLIMIT_CPU)."""
    file_size_mb: int = 512
    """Largest file the sandboxed process may write, MiB."""
    max_processes: int = 256
    """Process/thread count limit (RLIMIT_NPROC / pids limit)."""
    cpus: list[int] | None = None
    """CPU set to pin to (None: no pinning)."""
    gpus: list[int] | None = None
    """GPU device ids to expose (docker device requests / CUDA_VISIBLE_DEVICES)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for commands (after scrubbing secrets)."""
    hidden_paths: list[Path] = Field(default_factory=list)
    """Host paths the sandboxed code must not see (e.g. the task harness, infra_agent's tasks/)."""
    readonly_paths: list[Path] = Field(default_factory=list)
    """Extra host paths made visible read-only (e.g. a model folder, an SGLang environment)."""
    image: str | None = None
    """Container image (docker backend)."""
    secret_env_patterns: list[str] | None = None
    """Globs of environment variable names never passed in (None: the configured defaults)."""


@dataclass
class ExecResult:
    """The outcome of one command in the sandbox."""

    returncode: int
    """Exit status; negative for a signal (e.g. -9 after a timeout kill)."""
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    killed_reason: str | None = None
    """Why it was killed: 'timeout', 'memory', 'cpu_time', ... (None if it exited by itself)."""
    stray_processes: int = 0
    """Processes still alive in the sandbox after the command's main process ended (killed)."""


@dataclass
class SandboxProcess:
    """A long-running process inside a sandbox (an RPC worker, a server). Killed on cleanup."""

    pid: int
    """Host pid of the process (or of the container's init for docker)."""
    stdin: object
    stdout: object
    stderr_path: Path | None
    handle: object = field(default=None, repr=False)
    """Backend-specific handle (subprocess.Popen, container.ExecHandle); every backend's has
    `poll() -> int | None` and `wait(timeout) -> int` like subprocess.Popen."""


class Sandbox(abc.ABC):
    """One isolated copy of a workspace. Use as a context manager; `cleanup()` is idempotent."""

    backend: str = "abstract"

    def __init__(self, workspace: Path, spec: SandboxSpec) -> None:
        self.source = workspace
        self.spec = spec

    @property
    @abc.abstractmethod
    def root(self) -> Path:
        """Host path of the private workspace copy (what patches are applied to)."""

    @abc.abstractmethod
    def isolation(self) -> tuple[list[str], list[str]]:
        """(isolation in force, isolation asked for but missing), e.g. (['netns:unshare'], [])."""

    @abc.abstractmethod
    def exec(
        self, argv: list[str], *, timeout_s: float, stdin: bytes | None = None, cwd: str = "."
    ) -> ExecResult:
        """Run a command inside the sandbox; kill its whole process tree at the timeout."""

    @abc.abstractmethod
    def spawn(self, argv: list[str], *, cwd: str = ".") -> SandboxProcess:
        """Start a long-running command with pipes on stdin/stdout (binary). Killed by cleanup()."""

    @abc.abstractmethod
    def kill(self, process: SandboxProcess) -> int:
        """Kill a spawned process and everything it started. Returns how many were killed."""

    def read_file(self, relpath: str) -> bytes:
        return self._resolve(relpath).read_bytes()

    def write_file(self, relpath: str, data: bytes) -> None:
        target = self._resolve(relpath)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def _resolve(self, relpath: str) -> Path:
        target = (self.root / relpath).resolve()
        if not target.is_relative_to(self.root.resolve()):
            raise ValueError(f"path {relpath!r} is outside the sandbox workspace")
        return target

    @abc.abstractmethod
    def cleanup(self) -> None:
        """Kill every process, remove containers and the private copy. Safe to call twice."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
