"""A running SGLang server: start on a free port, wait for readiness, capture logs, stop cleanly.

    with Server.start(spec, workdir, knobs={...}) as server:   # raises ServerFailed with log tail
        server.url  # http://127.0.0.1:PORT

The server runs in its own process session and, by default, in its own network namespace with
only a loopback (`serving/netns.py`: patched SGLang code cannot reach the network or the host's
127.0.0.1 services) and under bubblewrap with a file view of system folders and what it needs
(`serving/fileview.py`: no homes, /run, /var or foreign /tmp files, its workdir the one place
it writes). Requests go through `server.call(fn, *args)`, which runs `fn(url, *args)`
on a thread inside that namespace; `server.url` is a host-loopback relay for callers that only
take a URL. Without the privileges for it the server runs on the host network and says so
(`server.network.render()`, first line of its log). `stop()` sends SIGTERM to the whole group,
waits `stop_timeout_s`, then SIGKILLs the group and any descendant that left it, waits until none
is alive, and closes the namespace's thread, relay and descriptor (the namespace dies with them).
A broken flag, a crash during start or a server that is not ready in time raises `ServerFailed`
(a `CandidateFailure`, so the experiment engine records FAILED) with the log tail. `pause()`
stops every process of the server until `resume()` (an experiment's idle arm takes no CPU);
`cpu_seconds()` is the CPU time its processes used (`infra_agent/proctree.py`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from infra_agent import proctree
from infra_agent.errors import UserError
from infra_agent.proctree import alive as _alive
from infra_agent.proctree import descendants
from infra_agent.sandboxes import cleanup as cleanup_registry
from infra_agent.serving import fileview, netns
from infra_agent.serving.deployment import ArgValue, DeploymentSpec, args_to_argv
from infra_agent.serving.env import ensure_sglang_env, env_python
from infra_agent.serving.tiny_model import write_tiny_model
from infra_agent.tasks.harness import CandidateFailure

T = TypeVar("T")
PR_SET_PDEATHSIG = 1
PORT_ATTEMPTS = 3
SHIM_DIR = Path(__file__).parent / "kernel_shim"
"""Holds the `sgl_kernel` CPU compatibility module (first on PYTHONPATH when no GPU is present)."""
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER")
"""Host variables a server inherits; everything else (API keys, tokens) is left behind."""


class ServerFailed(CandidateFailure):
    """The server did not start, crashed, or never became ready."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpu_count() -> int:
    """NVIDIA GPUs visible on this machine (device nodes /dev/nvidiaN)."""
    return sum(1 for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())


def has_gpu() -> bool:
    """True when an NVIDIA GPU is present (the CPU shim is used only without one)."""
    return gpu_count() > 0


def model_path(spec: DeploymentSpec, cache: Path) -> str:
    """The model argument: the generated tiny model's folder, or the spec's model as given."""
    if spec.model == "tiny":
        return str(
            write_tiny_model(cache / f"tiny-llama-seed{spec.model_seed}", seed=spec.model_seed)
        )
    return spec.model


def launch_command(
    spec: DeploymentSpec,
    *,
    port: int,
    knobs: dict[str, ArgValue] | None = None,
    model_cache: Path,
    overlay: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that start this deployment's server on 127.0.0.1:port."""
    if spec.launch == "docker":
        raise UserError("deployment launch = 'docker' is not built yet; use 'venv' or 'command'")
    if spec.launch == "venv":
        prefix = [
            str(env_python(ensure_sglang_env(spec.sglang_version))),
            "-m",
            "sglang.launch_server",
        ]
    elif spec.command:
        prefix = list(spec.command)
    else:
        raise UserError("deployment launch = 'command' needs a non-empty 'command'")
    args: dict[str, ArgValue] = {"model-path": model_path(spec, model_cache)}
    args.update(spec.server_args)
    args.update(knobs or {})
    args.update({"host": "127.0.0.1", "port": port})
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    path = []
    if overlay is not None:
        path.append(str(overlay))
    if not spec.needs_gpu and not has_gpu():
        env["SGLANG_USE_CPU_ENGINE"] = "1"  # without it, --device cpu takes the GPU code path
        path.append(str(SHIM_DIR))
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(spec.env)
    return prefix + args_to_argv(args), env


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL me if the process that started me dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _get(url: str, path: str, timeout_s: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url + path, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Server:
    """One server process group. Use `Server.start(...)`; always `stop()` (or use `with`)."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        port: int,
        workdir: Path,
        spec: DeploymentSpec,
        network: netns.Network | None = None,
    ) -> None:
        self.network = network or netns.Network(mode="host", reason="not started by Server.start")
        """Where the server's sockets live (isolated namespace, or host with the reason)."""
        self.filesystem = fileview.FileView(mode="host", reason="not started by Server.start")
        """What the server sees of the file system (confined view, or host with the reason)."""
        self.argv = argv
        self.env = env
        self.port = port
        self.spec = spec
        self.workdir = workdir
        self.log_path = workdir / f"server-{port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_s: float | None = None
        """Seconds from process start to the first 200 from the health path."""
        self._known: set[int] = set()
        self._paused = False
        self._ns_fd: int | None = None
        self._ns_thread: netns.NamespaceThread | None = None
        self._relay: netns.Relay | None = None

    @property
    def namespace_id(self) -> int | None:
        """Inode of the server's network namespace while it runs isolated, else None."""
        return None if self._ns_fd is None else os.fstat(self._ns_fd).st_ino

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
        if self._relay is None:
            if self._ns_fd is None:
                raise ServerFailed("the server is not running", kind="crash")
            self._relay = netns.Relay(self._ns_fd, self.port)
        return f"http://127.0.0.1:{self._relay.port}"

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(url, *args, **kwargs) where the server's address is reachable: the namespace's own
        thread when isolated (sockets fn opens live there), this thread otherwise."""
        if self._paused:
            raise RuntimeError(f"server on port {self.port} is paused: resume() it first")
        if self.network.mode == "host":
            return fn(self.direct_url, *args, **kwargs)
        if self._ns_thread is None:
            raise ServerFailed("the server is not running", kind="crash", log_tail=self.log_tail())
        return self._ns_thread.run(fn, self.direct_url, *args, **kwargs)

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
        workdir.mkdir(parents=True, exist_ok=True)
        network = netns.choose(spec.network)
        view = fileview.choose(spec.filesystem)
        for attempt in range(PORT_ATTEMPTS):
            port = free_port()
            argv, env = launch_command(
                spec,
                port=port,
                knobs=knobs,
                model_cache=model_cache or workdir / "models",
                overlay=overlay,
            )
            if view.mode == "confined":
                shown = [*fileview.paths_named(argv), *spec.readable_paths, SHIM_DIR]
                if overlay is not None:
                    shown.append(overlay)
                env["TMPDIR"] = "/tmp"  # a private one
                argv = fileview.wrap(
                    argv,
                    view,
                    shown=shown,
                    writable=workdir.resolve(),
                    isolate_network=network.mode == "isolated",
                    gpu=spec.needs_gpu or has_gpu(),
                )
            elif network.mode == "isolated":
                argv = netns.confine(argv)
            server = cls(argv, env, port=port, workdir=workdir, spec=spec, network=network)
            server.filesystem = view
            server._spawn()
            try:
                server.wait_ready(spec.ready_timeout_s)
                return server
            except ServerFailed as exc:
                server.stop()
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
        with self.log_path.open("ab") as log:
            log.write(f"infra-agent: server network: {self.network.render()}\n".encode())
            log.write(f"infra-agent: server file system: {self.filesystem.render()}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # PDEATHSIG fires when the spawning *thread* ends: only safe from the main thread.
                preexec_fn=_die_with_parent
                if threading.current_thread() is threading.main_thread()
                else None,
            )
        # Normal exit, exceptions, Ctrl-C and SIGTERM/SIGHUP of this process stop the server
        # (SGLang's own children die with their parent when this one is SIGKILLed).
        cleanup_registry.register(self)
        if self.network.mode == "isolated":
            try:
                self._ns_fd = netns.open_namespace(self.proc.pid, descendants=descendants)
            except OSError as exc:
                if self.proc.poll() is None:
                    raise ServerFailed(
                        f"server did not get its own network namespace ({exc})",
                        kind="crash",
                        log_tail=self.log_tail(),
                    ) from exc
                return  # it exited: wait_ready reports how, with the log tail
            self._ns_thread = netns.NamespaceThread(self._ns_fd, f"server-net-{self.port}")

    def cleanup(self) -> None:
        """Alias of stop() for the process-wide cleanup registry."""
        self.stop()

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
        assert self.proc is not None
        start = time.monotonic()
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerFailed(
                    f"server exited with status {code} before it was ready",
                    kind="crash",
                    log_tail=self.log_tail(),
                )
            self._known |= descendants(self.proc.pid)
            try:
                status, _ = self.get(self.spec.health_path, timeout_s=2.0)
            except OSError:  # URLError included
                status = 0
            if status == 200:
                self._check_identity()
                self.ready_s = time.monotonic() - start
                return self.ready_s
            if "address already in use" in self.log_tail(5):
                raise ServerFailed(
                    f"port {self.port} was taken", kind="crash", log_tail=self.log_tail()
                )
            if time.monotonic() - start > timeout_s:
                raise ServerFailed(
                    f"server not ready after {timeout_s:.0f} s",
                    kind="timeout",
                    log_tail=self.log_tail(),
                )
            time.sleep(0.5)

    def _check_identity(self) -> None:
        """The answer on our port must come from our server (same model path), not a stranger."""
        import json

        want = (
            self.argv[self.argv.index("--model-path") + 1] if "--model-path" in self.argv else None
        )
        status, body = self.get("/model_info")
        try:
            got = json.loads(body).get("model_path") if status == 200 else None
        except ValueError:
            got = None
        if want is not None and got != want:
            raise ServerFailed(
                f"port {self.port} answers for another server (model {got!r}): address already in use",
                kind="crash",
                log_tail=self.log_tail(),
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between `pause()` and `resume()`."""
        return self._paused

    def pause(self) -> None:
        """Stop (SIGSTOP) every process of the server: it takes no CPU until `resume()`."""
        if self.proc is not None and not self._paused:
            self._paused = True
            self._known |= proctree.freeze(self.proc.pid)

    def resume(self) -> None:
        """Continue a paused server."""
        if self.proc is not None and self._paused:
            proctree.thaw(self.proc.pid)
            self._paused = False

    def processes(self) -> set[int]:
        """The server's live processes (launcher, scheduler, detokenizer, ...)."""
        return proctree.tree(self.proc.pid) if self.proc is not None else set()

    def cpu_seconds(self) -> float:
        """CPU seconds used so far by the server's processes (and the children they reaped)."""
        return proctree.cpu_seconds(self.processes())

    def stop(self) -> int:
        """Stop the server and every process it started. Returns how many needed SIGKILL."""
        if self.proc is None:
            return 0
        pid = self.proc.pid
        group = set(self._known) | descendants(pid) | {pid}
        self._signal_group(pid, signal.SIGTERM)
        if self._paused:  # a stopped process holds SIGTERM until it runs again
            self._signal_group(pid, signal.SIGCONT)
            proctree.thaw(pid)
            self._paused = False
        deadline = time.monotonic() + self.spec.stop_timeout_s
        while time.monotonic() < deadline:
            self.proc.poll()
            group |= descendants(pid)
            if not any(_alive(p) for p in group):
                break
            time.sleep(0.2)
        stubborn = [p for p in group | descendants(pid) if _alive(p)]
        self._signal_group(pid, signal.SIGKILL)
        for p in stubborn:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            print(f"warning: server pid {pid} did not exit after SIGKILL", file=sys.stderr)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in stubborn) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.proc = None
        self._close_network()
        cleanup_registry.unregister(self)
        return len(stubborn)

    def _close_network(self) -> None:
        """Release everything of ours that holds the server's namespace (it dies with them)."""
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        if self._ns_thread is not None:
            self._ns_thread.close()
            self._ns_thread = None
        if self._ns_fd is not None:
            ns = os.fstat(self._ns_fd).st_ino
            os.close(self._ns_fd)
            self._ns_fd = None
            # Threads the namespace's thread started (resolver pools) end shortly after it.
            deadline = time.monotonic() + 15
            while (left := netns.own_threads_in(ns)) and time.monotonic() < deadline:
                time.sleep(0.1)
            if left:
                print(f"warning: threads still in the server's namespace: {left}", file=sys.stderr)

    @staticmethod
    def _signal_group(pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

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
        import json

        try:
            status, body = self.get("/get_server_info")
            return json.loads(body) if status == 200 else {}
        except (OSError, ValueError):
            return {}
