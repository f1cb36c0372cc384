"""Pausing a server (the idle arm of an experiment) and reading its CPU time, on a stand-in
server whose child spins like an idle SGLang scheduler (fast; the real server is exercised in
test_sglang_server.py); a helper that left the server's process tree is frozen with it, is a
violation the next call raises, and does not outlive the stop."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import stoppable

from infra_agent.sandboxes import proctree
from infra_agent.sandboxes.processes import pids_with_cmdline
from infra_agent.serving.deployment import DeploymentSpec
from infra_agent.serving.server import Server, ServerFailed

SPINNING_SERVER = textwrap.dedent(
    """
    import http.server, os, subprocess, sys
    HELPER = os.environ.get("HELPER_MARK", "helper")
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1])
    model = args[args.index("--model-path") + 1]
    # Like SGLang's scheduler: dies with its parent (PR_SET_PDEATHSIG), spins while idle; and like
    # SGLang, ready only once the child is (on a loaded machine a child still starting Python when
    # the owner is killed would never set its PDEATHSIG: paused, then orphaned, it would stay).
    spin = ("import ctypes, signal; ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
            "print('armed', flush=True); exec('while 1: pass')")
    child = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "armed\\n"
    print(f"child {child.pid}", flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/double-fork":  # a spinning helper reparented out of the tree
                if (middle := os.fork()) == 0:
                    if os.fork() == 0:
                        os.execv(sys.executable, [sys.executable, "-c", "while 1: pass", HELPER])
                    os._exit(0)
                os.waitpid(middle, 0)
            body = ('{"model_path": "%s"}' % model).encode() if self.path == "/model_info" else b""
            self.send_response(200 if self.path in ("/health", "/model_info", "/double-fork") else 404)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


def spinning(tmp_path: Path) -> DeploymentSpec:
    script = tmp_path / "spinning_server.py"
    script.write_text(SPINNING_SERVER)
    return DeploymentSpec(
        model="/nonexistent-model",
        launch="command",
        command=[sys.executable, str(script)],
        gpus=1,
        env={"HELPER_MARK": helper_mark(tmp_path)},
    )


def helper_mark(tmp_path: Path) -> str:
    return f"double-forked-helper-{tmp_path.name}-{os.getpid()}"


@pytest.fixture
def server(tmp_path: Path):  # type: ignore[no-untyped-def]
    srv = Server.start(spinning(tmp_path), tmp_path)
    yield srv
    srv.stop()


def _cpu_over(server: Server, seconds: float) -> float:
    before = server.cpu_seconds()
    time.sleep(seconds)
    return server.cpu_seconds() - before


def _execed(mark: str, limit_s: float = 60.0) -> list[int]:
    """The processes whose command line has `mark`, once there are any (a double-forked helper
    has its parent's command line until its exec; the limit bounds a helper that never comes)."""
    deadline = time.monotonic() + limit_s
    while not (found := pids_with_cmdline(mark)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


def _spins(server: Server, cpu_s: float = 0.1, limit_s: float = 120.0) -> bool:
    """True once the server's processes have used `cpu_s` more seconds of CPU; `limit_s` only
    bounds a server that never runs (a loaded machine gave the spinning child 0.04 s in 0.5 s
    once: how much it gets in a fixed window is the machine's, not the server's)."""
    before = server.cpu_seconds()
    deadline = time.monotonic() + limit_s
    while server.cpu_seconds() - before < cpu_s:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_paused_server_uses_no_cpu_and_resumes(server: Server) -> None:
    tree = server.processes()
    assert len(tree) >= 2  # the server and its spinning child
    assert _spins(server)  # the child spins
    server.pause()
    assert server.paused and server.stopped()
    assert _cpu_over(server, 0.5) == 0.0
    with pytest.raises(RuntimeError, match="paused"):
        server.get("/health")  # a call would hang until the timeout: refused instead
    server.resume()
    assert not server.paused and server.get("/health")[0] == 200
    assert _spins(server)


def test_a_double_forked_helper_is_frozen_reported_and_killed(
    server: Server, tmp_path: Path
) -> None:
    """A helper that left the server's process tree (the server's pid namespace made it a child
    of the namespace's init) is still in the server's cgroup: paused with it, named as a
    violation by the next call (an experiment's REJECTED), killed by the stop."""
    if server.confinement is None or not any("freezer" in w for w in server.confinement.in_force):
        pytest.skip(f"no cgroup freezer here: {server.confinement}")
    with pytest.raises(ServerFailed, match="left the server's process tree") as err:
        server.get("/double-fork")
    assert err.value.kind == "violation"
    (helper,) = _execed(helper_mark(tmp_path))  # found as a stray maybe before its exec
    parent = int(proctree.stat_fields(helper)[1])  # type: ignore[index]
    assert helper in server.processes() and parent not in server.processes()  # the ns's init
    assert proctree.cpu_seconds({helper}) > 0 or _spins(server, 0.01)  # it spins
    server.pause()
    assert server.stopped()
    before = proctree.cpu_seconds({helper})
    time.sleep(0.5)
    assert proctree.cpu_seconds({helper}) == before  # frozen with the server
    with pytest.raises(ServerFailed, match="left the server's process tree"):
        server.resume()
        server.get("/health")  # still there: still a violation
    server.stop()
    assert not proctree.alive(helper) and pids_with_cmdline(helper_mark(tmp_path)) == []
    assert len(server.violations) == 1 and str(helper) in server.violations[0]
    assert "while 1: pass" in server.violations[0]  # its own command line, not its parent's


def test_stopping_a_paused_server_leaves_nothing(server: Server) -> None:
    tree = server.processes()
    server.pause()
    started = time.monotonic()
    assert server.stop() == 0  # SIGTERM reached it: no SIGKILL needed
    assert time.monotonic() - started < 10
    assert not any(proctree.alive(p) for p in tree)


def test_cpu_seconds_counts_reaped_children(tmp_path: Path) -> None:
    # The parent's own time plus what its finished, reaped child used.
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
         "while time.process_time() - t < 0.3: pass'])\n"
         "print('done', flush=True)\ntime.sleep(30)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "done"
        assert proctree.cpu_seconds(proctree.tree(proc.pid)) >= 0.3
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_an_owner_stopped_while_its_server_is_paused_leaves_nothing(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """The experiment process is stopped, interrupted or killed while the idle arm's server is
    paused: the server and its children still end (cleanup continues and terminates them;
    on SIGKILL, PR_SET_PDEATHSIG reaches stopped processes too)."""
    owner = tmp_path / "owner.py"
    owner.write_text(
        textwrap.dedent(
            f"""
            import time
            from pathlib import Path
            from infra_agent.serving.deployment import DeploymentSpec
            from infra_agent.serving.server import Server
            spec = DeploymentSpec.model_validate_json({spinning(tmp_path).model_dump_json()!r})
            server = Server.start(spec, Path({str(tmp_path)!r}))
            server.pause()
            assert server.stopped()
            print(" ".join(str(p) for p in server.processes()), flush=True)
            time.sleep(600)
            """
        )
    )
    # Its own SIGINT/SIGTERM dispositions: under nohup the test runner's children ignore SIGINT.
    proc = subprocess.Popen(
        [sys.executable, str(owner)], stdout=subprocess.PIPE, text=True, preexec_fn=stoppable
    )
    assert proc.stdout is not None
    tree = {int(p) for p in proc.stdout.readline().split()}
    assert len(tree) >= 2
    proc.send_signal(sig)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while any(proctree.alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(proctree.alive(p) for p in tree)
