"""The `docker` backend: one locked-down container per sandbox, commands run as execs in it.

The container (from the locally built busybox image, see docker_engine.py) has no network, a
read-only root with a private /tmp tmpfs, memory/pids/CPU limits, all capabilities dropped,
no-new-privileges, and runs as an unprivileged uid of its own (confinement.allocate_uid). The
host's /usr, interpreter prefixes, virtual environment and the caller's read-only paths are
bind-mounted read-only at their host paths, the workspace copy read-write at its host path, so
paths mean the same inside and out. Memory: the cgroup limit (resident) plus RLIMIT_DATA (heap
and anonymous maps; docker has no RLIMIT_AS).

Each exec carries a marker variable; since the engine runs on this host, its processes are
visible in /proc, so a timeout kills exactly that command's process tree (setsid included), and
anything still carrying the marker after the command returned counts as a stray and is killed.
The docker engine is found through DOCKER_HOST (the test fixture points it at a private one).
"""

from __future__ import annotations

import importlib.util
import io
import itertools
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from infra_agent.sandboxes import cleanup, confinement, processes
from infra_agent.sandboxes.base import ExecResult, Sandbox, SandboxProcess, SandboxSpec
from infra_agent.sandboxes.cgroups import container_procs_file
from infra_agent.sandboxes.docker_engine import (
    LABEL,
    OWNER_LABEL,
    default_image,
    owner,
    remove_orphans,
)
from infra_agent.sandboxes.docker_streams import (
    DemuxReader,
    ExecHandle,
    SocketWriter,
    drain,
    send_all,
)
from infra_agent.sandboxes.environment import scrubbed_environment
from infra_agent.sandboxes.limits import MAX_OUTPUT_BYTES, signed_status
from infra_agent.sandboxes.workspace import PrivateCopy


def engine_problem(image: str | None = None) -> str | None:
    """None if a docker engine answers (DOCKER_HOST) and has the sandbox image, else why not."""
    if importlib.util.find_spec("docker") is None:
        return "the docker Python SDK is not installed (extra 'docker')"
    import docker

    try:
        client = docker.from_env(timeout=5)
        client.ping()
    except Exception as exc:
        return f"no docker engine answers (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')}): {type(exc).__name__}"
    try:
        client.images.get(image or default_image())
    except Exception:
        return (
            f"sandbox image {image or default_image()} is not built (docker_engine.ensure_engine)"
        )
    return None


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, workspace: Path, spec: SandboxSpec) -> None:
        import docker

        super().__init__(workspace, spec)
        self.id = uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)
        self._spawned: list[SandboxProcess] = []
        self._closed = False
        self._container: Any = None
        self._procs_file: Path | None = None
        self._client = docker.from_env(timeout=60)
        self.uid = confinement.allocate_uid() or os.geteuid()
        self.user = f"{self.uid}:{self.uid}"
        remove_orphans(self._client)
        self._copy = PrivateCopy(workspace.resolve(), owner_uid=self.uid)
        cleanup.register(self)
        try:
            self._hidden = self._hide(spec.hidden_paths)
            self._container = self._client.containers.run(**self._container_config())
            self._procs_file = container_procs_file(self._container)
        except BaseException:
            self.cleanup()
            raise

    @property
    def root(self) -> Path:
        return self._copy.root

    def isolation(self) -> tuple[list[str], list[str]]:
        s = self.spec
        in_force = [
            "netns:docker-none" if not s.network else "net:host (spec.network=True)",
            "pidns:docker",
            "fs:readonly-root",
            "tmp:private",
            "caps:none",
            "no-new-privileges",
            f"user:{self.uid}",
            f"cgroup:memory={s.memory_mb}MiB",
            f"cgroup:pids={s.max_processes}",
            f"rlimit:data={s.memory_mb}MiB",
            f"rlimit:cpu={s.cpu_time_s}s",
            f"rlimit:fsize={s.file_size_mb}MiB",
            "env:scrubbed",
            f"hidden:{len(s.hidden_paths)} paths",
        ]
        if s.cpus is not None:
            in_force.append(f"cpuset:{','.join(map(str, s.cpus))}")
        if s.gpus is not None:
            in_force.append(f"gpu:device-request={','.join(map(str, s.gpus))}")
        return in_force, []

    def exec(
        self, argv: list[str], *, timeout_s: float, stdin: bytes | None = None, cwd: str = "."
    ) -> ExecResult:
        self._check_open()
        n = next(self._counter)
        marker = f"{self.id}-{n}"
        exec_id, sock = self._start_exec(argv, marker, cwd, stdin=stdin is not None)
        started = time.monotonic()
        out, err = bytearray(), bytearray()
        strays: list[int] = []

        def reap_strays_once_exited() -> None:
            # Processes the command left behind keep the output stream open; once the command
            # itself has exited, count and kill them so the stream ends.
            if not strays and not self._client.api.exec_inspect(exec_id)["Running"]:
                strays.append(
                    processes.kill_marked(processes.PROCESS_VAR, marker, among=self._members)
                )

        timed_out = False
        try:
            if stdin is not None:
                send_all(sock, stdin, deadline=started + timeout_s)
                sock.shutdown(socket.SHUT_WR)
            deadline = started + timeout_s
            timed_out = not drain(sock, out, err, deadline=deadline, idle=reap_strays_once_exited)
        finally:
            sock.close()
            leftover = processes.kill_marked(processes.PROCESS_VAR, marker, among=self._members)
        duration = time.monotonic() - started
        info = self._client.api.exec_inspect(exec_id)
        code = info.get("ExitCode")
        returncode = -9 if timed_out or code is None else signed_status(int(code))
        return ExecResult(
            returncode=returncode,
            stdout=bytes(out[:MAX_OUTPUT_BYTES]).decode("utf-8", errors="replace"),
            stderr=bytes(err[:MAX_OUTPUT_BYTES]).decode("utf-8", errors="replace"),
            duration_s=duration,
            timed_out=timed_out,
            killed_reason="timeout" if timed_out else self._killed_reason(returncode),
            stray_processes=0 if timed_out else sum(strays) + leftover,
        )

    def spawn(self, argv: list[str], *, cwd: str = ".") -> SandboxProcess:
        self._check_open()
        n = next(self._counter)
        marker = f"{self.id}-{n}"
        exec_id, sock = self._start_exec(argv, marker, cwd, stdin=True)
        err_path = self._copy.state / f"{n}.spawn.e"
        stdout = io.BufferedReader(DemuxReader(sock, err_path))
        stdin = io.BufferedWriter(SocketWriter(sock))
        handle = ExecHandle(self._client.api, exec_id, marker, sock)
        process = SandboxProcess(
            pid=handle.host_pid(), stdin=stdin, stdout=stdout, stderr_path=err_path, handle=handle
        )
        self._spawned.append(process)
        return process

    def kill(self, process: SandboxProcess) -> int:
        handle = process.handle
        assert isinstance(handle, ExecHandle)
        killed = processes.kill_marked(processes.PROCESS_VAR, handle.marker, among=self._members)
        try:
            handle.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked on the stream
        except OSError:
            pass
        for stream in (process.stdin, process.stdout):
            try:
                stream.close()  # type: ignore[attr-defined]
            except Exception:
                pass
        handle.sock.close()
        if process in self._spawned:
            self._spawned.remove(process)
        return killed

    def cleanup(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            for process in list(self._spawned):
                self.kill(process)
            if self._container is not None:
                self._container.remove(force=True)
            else:  # created but not returned (Ctrl-C during run): find it by label
                for c in self._client.containers.list(
                    all=True, filters={"label": f"{LABEL}={self.id}"}
                ):
                    c.remove(force=True)
        finally:
            self._copy.destroy()
            cleanup.unregister(self)

    def write_file(self, relpath: str, data: bytes) -> None:
        super().write_file(relpath, data)
        self._copy.fix_ownership()

    # -- internals ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("sandbox was cleaned up")

    def _hide(self, paths: list[Path]) -> list[Path]:
        outside = []
        source = self.source.resolve()
        for path in (Path(p).resolve() for p in paths):
            if path.is_relative_to(source):
                self._copy.remove(path.relative_to(source))
            else:
                outside.append(path)
        return outside

    def _container_config(self) -> dict[str, Any]:
        import docker

        s = self.spec
        Mount = docker.types.Mount
        mounts: list[Any] = []
        readonly = [
            "/usr",
            *confinement.ETC_FILES,
            *map(str, confinement.python_paths(s.readonly_paths)),
        ]
        for path in dict.fromkeys([*readonly, *map(str, s.readonly_paths)]):
            if os.path.exists(path) and not os.path.islink(path):
                mounts.append(Mount(path, path, type="bind", read_only=True))
        mounts.append(Mount(str(self.root), str(self.root), type="bind", read_only=False))
        tmpfs = {"/tmp": f"size={s.file_size_mb}m,mode=1777"}
        mounted = [Path(m["Target"]) for m in mounts]
        for hidden in self._hidden:
            if not any(hidden.is_relative_to(m) for m in mounted):
                continue  # never mounted, so already invisible
            if hidden.is_dir():
                tmpfs[str(hidden)] = "size=1m,mode=0755"
            elif hidden.exists():
                mounts.append(Mount(str(hidden), "/dev/null", type="bind", read_only=True))
        mib = 1024 * 1024
        config: dict[str, Any] = dict(
            image=s.image or default_image(),
            command=["/bin/busybox", "sleep", "2147483647"],
            detach=True,
            init=True,
            labels={LABEL: self.id, OWNER_LABEL: owner()},
            network_mode="host" if s.network else "none",
            read_only=True,
            tmpfs=tmpfs,
            mounts=mounts,
            user=self.user,
            working_dir=str(self.root),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            mem_limit=s.memory_mb * mib,
            memswap_limit=s.memory_mb * mib,
            pids_limit=s.max_processes,
            ulimits=[
                docker.types.Ulimit(name="cpu", soft=s.cpu_time_s, hard=s.cpu_time_s),
                # Docker has no RLIMIT_AS; RLIMIT_DATA covers heap and private anonymous maps, so
                # untouched allocations (calloc'd zero pages, invisible to the memory cgroup)
                # still fail with MemoryError, as with the local backend's RLIMIT_AS.
                docker.types.Ulimit(name="data", soft=s.memory_mb * mib, hard=s.memory_mb * mib),
                docker.types.Ulimit(
                    name="fsize", soft=s.file_size_mb * mib, hard=s.file_size_mb * mib
                ),
            ],
            environment=self._environment(""),
        )
        if s.cpus is not None:
            config["cpuset_cpus"] = ",".join(map(str, s.cpus))
        if s.gpus is not None:
            config["device_requests"] = [
                docker.types.DeviceRequest(
                    device_ids=[str(g) for g in s.gpus], capabilities=[["gpu"]]
                )
            ]
        return config

    def _environment(self, marker: str) -> dict[str, str]:
        env = scrubbed_environment(
            os.environ,
            home=str(self.root),
            python_bin=str(Path(sys.executable).parent),
            secret_patterns=self.spec.secret_env_patterns,
            extra=self.spec.env,
        )
        env[processes.SANDBOX_VAR] = self.id
        if marker:
            env[processes.PROCESS_VAR] = marker
        if self.spec.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.spec.gpus))
        return env

    def _start_exec(
        self, argv: list[str], marker: str, cwd: str, *, stdin: bool
    ) -> tuple[str, socket.socket]:
        self._copy.fix_ownership()
        workdir = str(self._resolve(cwd))
        api = self._client.api
        exec_id = api.exec_create(
            self._container.id, argv, stdin=stdin, stdout=True, stderr=True,
            environment=self._environment(marker), workdir=workdir, user=self.user,
        )["Id"]  # fmt: skip
        raw = api.exec_start(exec_id, socket=True)
        sock: socket.socket = getattr(raw, "_sock", raw)
        return exec_id, sock

    def _members(self) -> list[int]:
        """Host pids of the container's processes: its cgroup, else every process (slower)."""
        if self._procs_file is not None:
            try:
                return [int(pid) for pid in self._procs_file.read_text().split()]
            except OSError:
                pass
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]

    def _killed_reason(self, returncode: int) -> str | None:
        if returncode == -9 and self._oom_kills() > 0:
            return "memory"
        from infra_agent.sandboxes.limits import killed_reason

        return killed_reason(returncode)

    def _oom_kills(self) -> int:
        """OOM kills in the container's memory cgroup so far (cgroup v1 or v2)."""
        try:
            self._container.reload()
            pid = self._container.attrs["State"]["Pid"]
            for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
                _, controllers, path = line.split(":", 2)
                for base in (
                    f"/sys/fs/cgroup/memory{path}/memory.oom_control",
                    f"/sys/fs/cgroup{path}/memory.events",
                ):
                    if ("memory" in controllers.split(",") or controllers == "") and os.path.exists(
                        base
                    ):
                        for row in Path(base).read_text().splitlines():
                            key, _, value = row.partition(" ")
                            if key == "oom_kill":
                                return int(value)
        except Exception:
            return 0
        return 0
