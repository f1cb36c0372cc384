"""Server lifecycle on a stand-in server process (fast): readiness, log tail, and that stopping
leaves no process behind, including children and a server that ignores SIGTERM. The real SGLang
server is exercised in test_sglang_server.py. The stand-in's child carries a mark of its test in
its command line: in the server's pid namespace its own pid means nothing out here."""

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import stoppable

from infra_agent.errors import UserError
from infra_agent.sandboxes.processes import pids_with_cmdline
from infra_agent.sandboxes.proctree import alive as _alive
from infra_agent.sandboxes.proctree import descendants
from infra_agent.serving.deployment import DeploymentSpec, args_to_argv, load_deployment
from infra_agent.serving.server import Server, ServerFailed

FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, signal, subprocess, sys, time
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "broken":
        print("error: unrecognized arguments: --no-such-flag", flush=True)
        sys.exit(2)
    os.makedirs(".cache/jit", exist_ok=True)  # like triton's or flashinfer's caches under HOME
    with open(".cache/jit/log", "a") as f:
        f.write("started\\n")
    mark = os.environ["FAKE_MARK"]
    child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {mark}"])
    print(f"child {child.pid}", flush=True)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "never":
        time.sleep(600)
    model = args[args.index("--model-path") + 1]
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = ('{"model_path": "%s"}' % model).encode() if self.path == "/model_info" else b""
            self.send_response(200 if self.path in ("/health", "/model_info") else 404)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    time.sleep(0.5)
    print("ready", flush=True)
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def spec(tmp_path: Path, mode: str, **kw: object) -> DeploymentSpec:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    return DeploymentSpec(
        model="/nonexistent-model",
        launch="command",
        command=[sys.executable, str(script)],
        gpus=1,  # no CPU shim / CPU engine settings for the stand-in
        env={"FAKE_MODE": mode, "FAKE_MARK": mark(tmp_path)},
        **kw,  # type: ignore[arg-type]
    )


def mark(tmp_path: Path) -> str:
    return f"fake-child-of-{tmp_path.name}-{os.getpid()}"


def child_pid(tmp_path: Path) -> int:
    """The host pid of the stand-in's child (it prints the one its pid namespace gave it)."""
    found = pids_with_cmdline(mark(tmp_path))
    assert len(found) == 1, found
    return found[0]


def test_start_ready_stop_leaves_nothing(tmp_path: Path) -> None:
    server = Server.start(spec(tmp_path, "ok"), tmp_path)
    pid = server.proc.pid  # type: ignore[union-attr]
    child = child_pid(tmp_path)
    assert server.get("/health")[0] == 200
    assert server.ready_s is not None and child in descendants(pid)
    assert server.stop() == 0  # SIGTERM was enough
    assert not _alive(pid) and not _alive(child)


def test_a_workdir_used_again_is_writable_to_the_next_server(tmp_path: Path) -> None:
    """Each start runs as a uid of its own: what the last server left in the workdir (its
    caches) is handed to the next one, which would otherwise fail to write there."""
    uids = []
    for _ in range(2):
        with Server.start(spec(tmp_path, "ok"), tmp_path) as server:
            assert server.confinement is not None
            uids.append(server.confinement.uid)
    assert (tmp_path / ".cache/jit/log").read_text() == "started\n" * 2
    if os.geteuid() == 0:
        assert uids[0] != uids[1] and 0 not in uids


def test_sigterm_ignored_escalates_to_sigkill(tmp_path: Path) -> None:
    s = spec(tmp_path, "stubborn", stop_timeout_s=1.0)
    with Server.start(s, tmp_path) as server:
        child = child_pid(tmp_path)
        pid = server.proc.pid  # type: ignore[union-attr]
    assert not _alive(pid) and not _alive(child)


def test_broken_flag_fails_with_log_tail(tmp_path: Path) -> None:
    with pytest.raises(ServerFailed) as err:
        Server.start(spec(tmp_path, "broken"), tmp_path)
    assert "exited with status 2" in str(err.value)
    assert "unrecognized arguments" in err.value.log_tail


def test_never_ready_times_out_and_is_stopped(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ServerFailed) as err:
        Server.start(spec(tmp_path, "never", ready_timeout_s=2.0), tmp_path)
    assert err.value.kind == "timeout" and "not ready after 2 s" in str(err.value)
    assert pids_with_cmdline(mark(tmp_path)) == []  # nor its child, if it had started one
    assert time.monotonic() - started < 60


def test_server_env_leaves_secrets_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    with Server.start(spec(tmp_path, "ok"), tmp_path) as server:
        environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes()  # type: ignore[union-attr]
    assert b"sk-secret" not in environ and b"HF_HUB_OFFLINE=1" in environ
    assert os.environ["OPENAI_API_KEY"] == "sk-secret"


def test_a_stranger_on_the_port_is_not_our_server(tmp_path: Path) -> None:
    # On the host network a port picked free can be taken by another server before ours binds
    # it (an isolated server has its namespace's ports to itself).
    other = Server.start(spec(tmp_path, "ok", network="host"), tmp_path / "a")
    try:
        mine = Server(
            ["x", "--model-path", "/my-model"],
            {},
            port=other.port,
            workdir=tmp_path,
            spec=spec(tmp_path, "ok"),
        )
        with pytest.raises(ServerFailed, match="answers for another server"):
            mine._check_identity()
    finally:
        other.stop()


def test_args_to_argv_and_spec_errors(tmp_path: Path) -> None:
    argv = args_to_argv({"chunked-prefill-size": 64, "disable_radix_cache": True, "x": False})
    assert argv == ["--chunked-prefill-size", "64", "--disable-radix-cache"]
    bad = tmp_path / "d.toml"
    bad.write_text("[deployment]\ngpus = 'two'\n")
    with pytest.raises(UserError, match="deployment.gpus"):
        load_deployment(bad)
    bad.write_text("[deployment]\nlaunch = 'command'\n")
    from infra_agent.serving.launch import launch_command

    with pytest.raises(UserError, match="needs a non-empty 'command'"):
        launch_command(load_deployment(bad), port=1, model_cache=tmp_path)


def test_sigterm_of_the_owner_stops_the_server(tmp_path: Path) -> None:
    import signal
    import subprocess

    s = spec(tmp_path, "ok")
    owner = tmp_path / "owner.py"
    owner.write_text(
        textwrap.dedent(
            f"""
            import time
            from pathlib import Path
            from infra_agent.serving.deployment import DeploymentSpec
            from infra_agent.serving.server import Server
            spec = DeploymentSpec.model_validate_json({s.model_dump_json()!r})
            server = Server.start(spec, Path({str(tmp_path)!r}))
            print(server.proc.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(owner)], stdout=subprocess.PIPE, text=True, preexec_fn=stoppable
    )
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    tree = descendants(pid) | {pid}
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in tree)
