"""A running SGLang server: start on a free port, wait for readiness, capture logs, stop cleanly.

    with Server.start(spec, workdir, knobs={...}) as server:   # raises ServerFailed with log tail
        server.url  # http://127.0.0.1:PORT

A source patch runs inside the server, so the server is confined like any candidate
(`serving/isolation.py`, the sandbox layer's own code): its own pid namespace, uid, rlimits and
cgroup, a network namespace with only a loopback (`sandboxes/netns.py`) and a file view in which
the originals of the modules its arm changed do not exist (`sandboxes/fileview.py`,
`serving/overlay.py`); `server.confinement.render()` (third line of its log) says what it really
had. Requests go through `server.call(fn, *args)`, which runs `fn(url, *args)` on a thread
inside that namespace; `server.url` is a host-loopback relay for callers that only take a URL.
A broken flag, a crash during start or a server that is not ready in time raises `ServerFailed`
(a `CandidateFailure`, so the experiment engine records FAILED) with the log tail.

The server's processes are held together by the sandbox layer (`sandboxes/confined.py`): its
cgroup is frozen by `pause()` until `resume()` (an experiment's idle arm takes no CPU),
`cpu_seconds()` counts everything that ran in it, and `stop()` ends every process, then closes
the namespace's thread, relay and descriptor. A process that left the server's process tree
(double-forked, orphaned) is a violation: the next `call` raises `ServerFailed(kind="violation")`
naming it (the engine records REJECTED), and `stop` lists it in `violations`. The command line
comes from `serving/launch.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from infra_agent.sandboxes import cleanup as cleanup_registry
from infra_agent.sandboxes import fileview, netns
from infra_agent.sandboxes import processes as sandbox_processes
from infra_agent.sandboxes.confined import ConfinedProcesses
from infra_agent.sandboxes.proctree import descendants
from infra_agent.serving import isolation
from infra_agent.serving import overlay as overlays
from infra_agent.serving.deployment import ArgValue, DeploymentSpec
from infra_agent.serving.launch import SHIM_DIR, free_port, gpu_count, launch_command
from infra_agent.tasks.harness import CandidateFailure

T = TypeVar("T")
PORT_ATTEMPTS = 3


class ServerFailed(CandidateFailure):
    """The server did not start, crashed, or never became ready."""


def _get(url: str, path: str, timeout_s: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url + path, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Server:
    """One confined server (its cgroup, or its process tree without one). Use
    `Server.start(...)`; always `stop()` (or use `with`)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        port: int,
        workdir: Path,
        spec: DeploymentSpec,
        jail: isolation.Jail | None = None,
    ) -> None:
        self.network = (
            jail.network
            if jail
            else netns.Network(mode="host", reason="not started by Server.start")
        )
        """Where the server's sockets live (isolated namespace, or host with the reason)."""
        self.filesystem = (
            jail.filesystem
            if jail
            else fileview.FileView(mode="host", reason="not started by Server.start")
        )
        """What the server sees of the file system (confined view, or host with the reason)."""
        self.confinement = jail.record if jail else None
        """The confinement the server really had (None: not started by Server.start)."""
        self.argv = argv
        self.env = env
        self.port = port
        self.spec = spec
        self.workdir = workdir
        self.log_path = workdir / f"server-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s: float | None = None
        """Seconds from process start to the first 200 from the health path."""
        self.violations: list[str] = []
        """Processes found outside the server's process tree (each a sentence)."""
        self._jail = jail
        self._group: ConfinedProcesses | None = None
        """Its processes, held together (from the spawn on)."""
        self._net: netns.Attachment | None = None
        """Our hold on its network namespace while it runs isolated."""

    @property
    def namespace_id(self) -> int | None:
        """Inode of the server's network namespace while it runs isolated, else None."""
        return None if self._net is None else self._net.id

    @property
    def direct_url(self) -> str:
        """The server's address where it listens: valid in its namespace (inside `call`)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """An address any thread of this process can use (a relay when the server is isolated).
        Measurements use `call`, which reaches the server without the relay."""
        if self.network.mode == "host":
            return self.direct_url
        if self._net is None:
            raise ServerFailed("the server is not running", kind="crash")
        return f"http://127.0.0.1:{self._net.relay_port()}"

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(url, *args, **kwargs) where the server's address is reachable: the namespace's own
        thread when isolated (sockets fn opens live there), this thread otherwise. Raises
        ServerFailed(kind='violation') when a process left the server's tree, before or during."""
        if self.paused:
            raise RuntimeError(f"server on port {self.port} is paused: resume() it first")
        self._raise_violations()
        if self.network.mode == "host":
            result = fn(self.direct_url, *args, **kwargs)
        elif self._net is None:
            raise self._failed("the server is not running")
        else:
            result = self._net.run(fn, self.direct_url, *args, **kwargs)
        self._raise_violations()
        return result

    @classmethod
    def start(
        cls,
        spec: DeploymentSpec,
        workdir: Path,
        *,
        knobs: dict[str, ArgValue] | None = None,
        overlay: Path | None = None,
        model_cache: Path | None = None,
    ) -> Server:
        """Start and wait for readiness; on any failure the server is stopped and ServerFailed raised."""
        workdir = workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        replaced, stale = (
            overlays.served_view(overlay, spec.sglang_version) if overlay else ({}, [])
        )
        for attempt in range(PORT_ATTEMPTS):
            port = free_port()
            argv, env = launch_command(
                spec,
                port=port,
                knobs=knobs,
                model_cache=model_cache or workdir / "models",
                overlay=overlay,
            )
            shown = [*fileview.paths_named(argv), *spec.readable_paths, SHIM_DIR]
            jail = isolation.confine(
                spec,
                f"server-{port}",
                workdir=workdir,
                shown=[*shown, *([overlay] if overlay else [])],
                replaced=replaced,
                hidden=stale,
                gpus=list(range(gpu_count())) or None,
            )
            env.update({"HOME": str(workdir), "USER": "sglang", "LOGNAME": "sglang"})
            if jail.filesystem.mode == "confined":
                env["TMPDIR"] = "/tmp"  # a private one
            server = cls(argv, env, port=port, workdir=workdir, spec=spec, jail=jail)
            try:
                server._spawn()
                server.wait_ready(spec.ready_timeout_s)
                return server
            except ServerFailed as exc:
                server.stop()
                exc.confinement = jail.record  # type: ignore[attr-defined]  # for the evidence
                # The port was free when picked, but the server binds it only after its imports
                # (minutes on a busy machine): another process may have taken it meanwhile.
                taken = "address already in use" in exc.log_tail + str(exc)
                if not taken or attempt == PORT_ATTEMPTS - 1:
                    raise
            except BaseException:
                server.stop()
                raise
        raise AssertionError("unreachable")

    def _spawn(self) -> None:
        jail = self._jail
        assert jail is not None
        with self.log_path.open("ab") as log:
            log.write(f"infra-agent: server network: {self.network.render()}\n".encode())
            log.write(f"infra-agent: server file system: {self.filesystem.render()}\n".encode())
            log.write(f"infra-agent: server confinement: {jail.record.render()}\n".encode())
            log.flush()
            # From the sandbox layer's launcher thread: PR_SET_PDEATHSIG fires when the thread
            # that started a process ends, and that one lives as long as this process.
            self.proc = sandbox_processes.launch(
                [*jail.prefix, *self.argv],
                env=self.env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=jail.preexec(),
            )
        self._group = ConfinedProcesses(
            self.proc, jail.cgroup, wrappers=jail.wrappers, owner="server"
        )
        self._group.violations = self.violations  # one list: it outlives the processes
        # Normal exit, exceptions, Ctrl-C and SIGTERM/SIGHUP of this process stop the server
        # (its processes die with their parent when this one is SIGKILLed).
        cleanup_registry.register(self)
        if self.network.mode == "isolated":
            try:
                fd = netns.open_namespace(self.proc.pid, descendants=descendants)
            except OSError as exc:
                if self.proc.poll() is None:
                    raise self._failed(
                        f"server did not get its own network namespace ({exc})"
                    ) from exc
                return  # it exited: wait_ready reports how, with the log tail
            self._net = netns.Attachment(fd, f"server-net-{self.port}", self.port)

    def cleanup(self) -> None:
        """Alias of stop() for the process-wide cleanup registry."""
        self.stop()

    def _failed(self, message: str, kind: str = "crash") -> ServerFailed:
        return ServerFailed(message, kind=kind, log_tail=self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def get(self, path: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
        """(status, body) of GET path on the server."""
        return self.call(_get, path, timeout_s)

    def wait_ready(self, timeout_s: float) -> float:
        """Poll the health path until 200; return seconds waited. ServerFailed on exit/timeout."""
        assert self.proc is not None and self._group is not None
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise self._failed(f"server exited with status {code} before it was ready")
            self._group.note_tree()
            try:
                status, _ = self.get(self.spec.health_path, timeout_s=2.0)
            except OSError:  # URLError included
                status = 0
            if status == 200:
                self._check_identity()
                self.ready_s = time.monotonic() - start
                return self.ready_s
            if "address already in use" in self.log_tail(5):
                raise self._failed(f"port {self.port} was taken")
            if time.monotonic() - start > timeout_s:
                raise self._failed(f"server not ready after {timeout_s:.0f} s", kind="timeout")
            time.sleep(0.5)

    def _check_identity(self) -> None:
        """The answer on our port must come from our server (same model path), not a stranger."""
        want = (
            self.argv[self.argv.index("--model-path") + 1] if "--model-path" in self.argv else None
        )
        status, body = self.get("/model_info")
        try:
            got = json.loads(body).get("model_path") if status == 200 else None
        except ValueError:
            got = None
        if want is not None and got != want:
            raise self._failed(
                f"port {self.port} answers for another server (model {got!r}): address already in use"
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between `pause()` and `resume()`."""
        return self._group is not None and self._group.paused

    def pause(self) -> None:
        """Stop every process of the server (its cgroup frozen, else SIGSTOP to its tree): it
        takes no CPU until `resume()`."""
        if self.proc is not None and self._group is not None:
            self._group.pause()

    def stopped(self) -> bool:
        """True when the kernel reports every process of the server stopped (its cgroup frozen,
        else each process of its tree in state T)."""
        return self.proc is not None and self._group is not None and self._group.stopped()

    def resume(self) -> None:
        """Continue a paused server."""
        if self.proc is not None and self._group is not None:
            self._group.resume()

    @contextmanager
    def placed_on(self, cpu: int) -> Iterator[bool]:
        """Every thread of the server held on `cpu` for the block, then freed
        (`ConfinedProcesses.placed_on`): its busy scheduler starts what follows on `cpu`.
        Yields False where it could not be moved."""
        if self.proc is None or self._group is None:
            yield False
            return
        with self._group.placed_on(cpu) as moved:
            yield moved

    def processes(self) -> set[int]:
        """The server's live processes (launcher, scheduler, detokenizer, ...; not its
        confinement's own)."""
        if self.proc is None or self._group is None:
            return set()
        return self._group.processes()

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the server's processes (its cgroup: every process that
        ran in it; else the tree and the children it reaped)."""
        if self.proc is None or self._group is None:
            return 0.0
        return self._group.cpu_seconds()

    def _raise_violations(self) -> None:
        if self._group is not None and self.proc is not None:
            self._group.find_strays()
        if self.violations:
            raise ServerFailed(
                f"confinement: {self.violations[0]}"
                + (f" (and {len(self.violations) - 1} more)" if len(self.violations) > 1 else ""),
                kind="violation",
                log_tail=self.log_tail(),
            )

    def stop(self) -> int:
        """Stop the server and every process it started (`ConfinedProcesses.terminate`).
        Returns how many needed SIGKILL; processes found outside its tree are added to
        `violations` (and killed first)."""
        if self.proc is None or self._group is None:
            return 0
        # In its own pid namespace the server's command shuts its processes down itself and the
        # namespace ends with it (SGLang takes a scheduler killed first for a crash: +5 s).
        alone = self.confinement is not None and self.confinement.pid_namespace
        stubborn = self._group.terminate(self.spec.stop_timeout_s, alone=alone)
        self.proc = None
        if self._jail is not None:
            self._jail.close()
        if self._net is not None:  # the namespace dies with our hold on it
            self._net.close()
            self._net = None
        cleanup_registry.unregister(self)
        if self.violations:
            print(
                f"warning: server on port {self.port}: {'; '.join(self.violations)}",
                file=sys.stderr,
            )
        return stubborn

    def __enter__(self) -> Server:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def info(self) -> dict[str, Any]:
        """What the server says about itself (GET /get_server_info), {} if it cannot say."""
        try:
            status, body = self.get("/get_server_info")
            return json.loads(body) if status == 200 else {}
        except (OSError, ValueError):
            return {}
