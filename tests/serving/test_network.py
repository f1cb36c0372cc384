"""The server's network confinement, on a stand-in server started through `Server.start` (fast):
code in the server process cannot reach a listener on the host's 127.0.0.1 nor any route out,
while the driver still reaches the server (`call`, `get`, the `url` relay); stopping leaves no
process and no thread in the namespace; without the privileges it falls back to the host network
and says so. The real SGLang server runs isolated in test_sglang_server.py."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import stoppable

from infra_agent.errors import UserError
from infra_agent.sandboxes import netns
from infra_agent.sandboxes.proctree import alive as _alive
from infra_agent.sandboxes.proctree import descendants
from infra_agent.serving.deployment import DeploymentSpec, load_deployment
from infra_agent.serving.server import Server

needs_isolation = pytest.mark.skipif(
    netns.unavailable() is not None, reason=f"no network isolation here: {netns.unavailable()}"
)

PROBE_SERVER = textwrap.dedent(
    """
    import http.server, json, os, socket, sys
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    model = args[args.index("--model-path") + 1]
    found = {}
    for name, addr in [("host_loopback", ("127.0.0.1", int(os.environ["PROBE_PORT"]))),
                       ("outside", ("192.0.2.1", 80))]:
        try:
            socket.create_connection(addr, timeout=3).close()
            found[name] = "connected"
        except OSError as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    found["interfaces"] = sorted(name for _, name in socket.if_nameindex())
    try:
        found["secret"] = open(os.environ["PROBE_SECRET"]).read()
    except OSError as exc:
        found["secret"] = f"{type(exc).__name__}: {exc}"
    try:
        unix = socket.socket(socket.AF_UNIX)
        unix.connect(os.environ["PROBE_SOCKET"])
        found["unix_socket"] = "connected"
    except OSError as exc:
        found["unix_socket"] = f"{type(exc).__name__}: {exc}"
    found["home_var"] = os.environ["HOME"]
    try:
        found["home"] = sorted(os.listdir(os.environ["PROBE_HOME"]))
    except OSError as exc:
        found["home"] = f"{type(exc).__name__}: {exc}"
    try:
        open(os.path.join(os.path.dirname(sys.executable), "probe-was-here"), "w").close()
        found["write_interpreter_dir"] = "written"
    except OSError as exc:
        found["write_interpreter_dir"] = f"{type(exc).__name__}: {exc}"
    with open("probe.json", "w") as f:  # the cwd is the server's workdir
        json.dump(found, f)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"model_path": model}).encode()
            self.send_response(200 if self.path in ("/health", "/model_info") else 404)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@dataclass
class HostSide:
    """What the server must not reach: a TCP listener on the host's 127.0.0.1 and, in a folder
    of its own, a secret file and a UNIX socket listener (as a docker.sock would be)."""

    listener: socket.socket
    private: Path


@pytest.fixture
def host_listener(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostSide]:
    private = tmp_path_factory.mktemp("host-private")
    (private / "secret.txt").write_text("api-key-of-the-host")
    with socket.socket() as sock, socket.socket(socket.AF_UNIX) as unix:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        unix.bind(str(private / "engine.sock"))
        unix.listen(8)
        yield HostSide(sock, private)


def probe_spec(tmp_path: Path, host: HostSide, **kw: object) -> DeploymentSpec:
    script = tmp_path / "probe_server.py"
    script.write_text(PROBE_SERVER)
    return DeploymentSpec(
        model="/nonexistent-model",
        launch="command",
        command=[sys.executable, str(script)],
        gpus=1,  # no CPU shim / CPU engine settings for the stand-in
        env={
            "PROBE_PORT": str(host.listener.getsockname()[1]),
            "PROBE_SECRET": str(host.private / "secret.txt"),
            "PROBE_SOCKET": str(host.private / "engine.sock"),
            "PROBE_HOME": str(Path.home()),
        },
        **kw,  # type: ignore[arg-type]
    )


def probe(server: Server) -> dict[str, object]:
    found: dict[str, object] = json.loads((server.workdir / "probe.json").read_text())
    return found


@needs_isolation
def test_isolated_server_reaches_nothing_but_the_driver_reaches_it(
    tmp_path: Path, host_listener: HostSide
) -> None:
    with Server.start(probe_spec(tmp_path, host_listener), tmp_path) as server:
        assert server.network.mode == "isolated"
        found = probe(server)
        assert found["host_loopback"] == "ConnectionRefusedError: [Errno 111] Connection refused"
        assert "Network is unreachable" in str(found["outside"])
        assert found["interfaces"] == ["lo"]
        # The file system: only what the server needs; no foreign files, sockets or homes.
        assert server.filesystem.mode == "confined", server.filesystem.render()
        assert str(found["secret"]).startswith("FileNotFoundError"), found
        assert str(found["unix_socket"]).startswith("FileNotFoundError"), found
        home = Path.home()
        needed = {Path(p).relative_to(home).parts[0] for p in server.filesystem.shown
                  if Path(p).is_relative_to(home)}  # fmt: skip
        # The home shows at most the folders of the interpreters it needs (pyenv here); the
        # server's own HOME is its workdir.
        assert isinstance(found["home"], str) or set(found["home"]) <= needed, (found, needed)
        assert found["home_var"] == str(tmp_path.resolve())
        assert "Read-only file system" in str(found["write_interpreter_dir"]), found
        assert (
            server.log_tail()
            .splitlines()[1]
            .startswith("infra-agent: server file system: confined")
        )
        # The driver: through the namespace's thread, and through the relay from this thread.
        assert server.get("/health")[0] == 200
        assert server.call(lambda url: url) == server.direct_url
        with urllib.request.urlopen(server.url + "/model_info", timeout=30) as resp:
            assert json.loads(resp.read())["model_path"] == "/nonexistent-model"
        with pytest.raises(OSError):  # the server's own port is not on the host's loopback
            urllib.request.urlopen(server.direct_url + "/health", timeout=5)
        assert server.log_tail().startswith("infra-agent: server network: isolated")


def test_host_network_reaches_the_listener_and_says_so(
    tmp_path: Path, host_listener: HostSide
) -> None:
    """The control: the same probe on the host network and file system reaches the listener,
    the secret and the UNIX socket (so the probe can tell)."""
    spec = probe_spec(tmp_path, host_listener, network="host", filesystem="host")
    with Server.start(spec, tmp_path) as server:
        found = probe(server)
        assert found["host_loopback"] == "connected"
        assert found["secret"] == "api-key-of-the-host" and found["unix_socket"] == "connected"
        assert server.filesystem.render() == (
            "host (unconfined: the deployment sets filesystem = 'host')"
        )
        assert server.network.render() == "host (unconfined: the deployment sets network = 'host')"
        assert server.url == server.direct_url and server.get("/health")[0] == 200


def test_without_privileges_it_falls_back_to_the_host_network_plainly(
    tmp_path: Path, host_listener: HostSide, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netns, "unavailable", lambda: "not root: test")
    with Server.start(probe_spec(tmp_path, host_listener), tmp_path) as server:
        assert server.network.mode == "host" and probe(server)["host_loopback"] == "connected"
        first = server.log_tail().splitlines()[0]
        assert first == "infra-agent: server network: host (unconfined: not root: test)"


@needs_isolation
def test_stop_leaves_no_process_and_no_namespace(tmp_path: Path, host_listener: HostSide) -> None:
    server = Server.start(probe_spec(tmp_path, host_listener), tmp_path)
    assert server.proc is not None and server.namespace_id is not None
    pid = server.proc.pid
    ns = server.namespace_id
    assert ns != netns.namespace_id("self")
    server.get("/health")
    server.url  # noqa: B018 - starts the relay, which holds sockets in the namespace
    assert len(netns.users(ns)) >= 3  # the server, the driver's thread, the relay's thread
    server.stop()
    assert not _alive(pid) and netns.users(ns) == []
    assert f"net:[{ns}]" not in open_files()  # the namespace descriptor was closed


def open_files() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the listing's own descriptor
            continue
    return found


@needs_isolation
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_killed_owner_leaves_no_process_and_no_namespace(
    tmp_path: Path, host_listener: HostSide, sig: signal.Signals
) -> None:
    """The process that started the server is stopped (SIGTERM), interrupted (Ctrl-C) or killed
    (a crash): the server dies (cleanup, or PR_SET_PDEATHSIG) and with it the namespace."""
    spec = probe_spec(tmp_path, host_listener)
    owner = tmp_path / "owner.py"
    owner.write_text(
        textwrap.dedent(
            f"""
            import time
            from pathlib import Path
            from infra_agent.serving.deployment import DeploymentSpec
            from infra_agent.sandboxes import netns
            from infra_agent.serving.server import Server
            spec = DeploymentSpec.model_validate_json({spec.model_dump_json()!r})
            server = Server.start(spec, Path({str(tmp_path)!r}))
            server.url
            print(server.proc.pid, server.namespace_id, flush=True)
            time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(owner)], stdout=subprocess.PIPE, text=True, preexec_fn=stoppable
    )
    assert proc.stdout is not None
    pid, ns = (int(x) for x in proc.stdout.readline().split())
    tree = descendants(pid) | {pid}
    assert netns.users(ns)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while (netns.users(ns) or any(_alive(p) for p in tree)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in tree) and netns.users(ns) == []


def test_network_mode_in_the_deployment_spec(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text("[deployment]\n")
    assert load_deployment(path).network == "isolated"
    path.write_text("[deployment]\nnetwork = 'host'\n")
    assert load_deployment(path).network == "host"
    path.write_text("[deployment]\nnetwork = 'none'\n")
    with pytest.raises(UserError, match="deployment.network"):
        load_deployment(path)
