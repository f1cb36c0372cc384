"""The sandbox contract: every backend must pass these (parametrized over local and docker)."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support import stoppable

from infra_agent.sandboxes import processes

alive_with = processes.pids_with_cmdline


def gone_within(token: str, seconds: float) -> bool:
    """True once no process with `token` is seen in 3 scans in a row (a process being torn
    down can vanish from one scan of /proc and still show in the next)."""
    deadline = time.monotonic() + seconds
    empty = 0
    while time.monotonic() < deadline:
        empty = empty + 1 if not alive_with(token) else 0
        if empty == 3:
            return True
        time.sleep(0.1)
    return False


def unique_sleep() -> str:
    """A sleep duration no other process on the machine uses, to find its processes by."""
    return f"{random.randint(100000, 999999)}.{random.randint(10, 99)}"


def test_workspace_is_a_private_copy(make_sandbox, workspace: Path) -> None:
    sb = make_sandbox()
    assert sb.root != workspace and (sb.root / "kernel.py").exists()
    r = sb.exec(
        ["sh", "-c", "echo changed > kernel.py; echo new > made.txt; cat data/input.txt"],
        timeout_s=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "42\n"
    assert (workspace / "kernel.py").read_text().startswith("def f")
    assert not (workspace / "made.txt").exists()
    assert sb.read_file("made.txt") == b"new\n"
    sb.write_file("sub/patched.py", b"X = 1\n")
    r = sb.exec(["sh", "-c", "cat sub/patched.py && echo more >> sub/patched.py"], timeout_s=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "X = 1\n"
    assert sb.read_file("sub/patched.py") == b"X = 1\nmore\n"
    with pytest.raises(ValueError):
        sb.read_file("../../etc/passwd")


def test_exec_reports_exit_status_stdin_and_cwd(make_sandbox) -> None:
    sb = make_sandbox()
    r = sb.exec(["python", "-c", "import sys, os; print(sys.stdin.read().upper(), os.getcwd()); sys.exit(3)"],
                timeout_s=60, stdin=b"ping", cwd="data")  # fmt: skip
    assert r.returncode == 3
    assert r.stdout.split() == ["PING", str(sb.root / "data")]
    assert not r.timed_out and r.killed_reason is None


def test_cpu_pinning(make_sandbox) -> None:
    sb = make_sandbox(cpus=[0])
    r = sb.exec(["python", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], timeout_s=60)
    assert r.stdout == "[0]\n", r.stderr
    assert any(item.startswith("cpuset:0") for item in sb.isolation()[0])


def test_timeout_kills_the_whole_tree(make_sandbox) -> None:
    sb = make_sandbox()
    token = unique_sleep()
    # a background grandchild, one escaped into its own session, and the main sleeper
    script = f"sleep {token} & (setsid sleep {token} &) ; sleep {token}"
    started = time.monotonic()
    r = sb.exec(["sh", "-c", script], timeout_s=1.0)
    assert r.timed_out and r.killed_reason == "timeout" and r.returncode == -9
    # It returned rather than waiting for the sleeps (over 100,000 s; a container's kill on a
    # loaded machine takes seconds): a bound no machine gets near either way.
    assert time.monotonic() - started < 300
    assert alive_with(token) == []


def test_processes_left_behind_are_counted_and_killed(make_sandbox) -> None:
    sb = make_sandbox()
    token = unique_sleep()
    r = sb.exec(
        ["sh", "-c", f"(setsid sleep {token} > /dev/null 2>&1 &); echo started"], timeout_s=30
    )
    assert r.returncode == 0 and r.stdout == "started\n"
    assert r.stray_processes >= 1
    assert alive_with(token) == []


def test_no_network(make_sandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        sb = make_sandbox()
        probe = textwrap.dedent(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3)
                print("CONNECTED")
            except OSError as exc:
                print("refused", type(exc).__name__)
            routes = open("/proc/net/route").read().splitlines()[1:]
            print("routes", len(routes))
            links = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
            print("links", ",".join(sorted(links)))
            if not routes:  # only then: with a route, a lookup could leave this machine
                try:
                    socket.getaddrinfo("infra-agent-probe.invalid", 80)
                    print("RESOLVED")
                except OSError as exc:
                    print("dns failed", type(exc).__name__)
        """)
        r = sb.exec(["python", "-c", probe], timeout_s=60)
        assert r.returncode == 0, r.stderr
        assert "CONNECTED" not in r.stdout
        assert "routes 0" in r.stdout  # no route anywhere: no DNS, no outside host
        assert "dns failed" in r.stdout
        assert "links lo\n" in r.stdout
        in_force, _missing = sb.isolation()
        assert any(item.startswith("netns:") for item in in_force)
    finally:
        server.close()


def test_network_true_reaches_host_loopback(make_sandbox) -> None:
    """Serving targets: spec.network=True lets the sandbox talk to 127.0.0.1 on the host, and
    the sandbox records that its network is not isolated."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        sb = make_sandbox(network=True)
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=10); print('CONNECTED')"
        r = sb.exec(["python", "-c", probe], timeout_s=60)
        assert r.stdout == "CONNECTED\n", r.stderr
        in_force, _missing = sb.isolation()
        assert any(item.startswith("net:host") for item in in_force)
        assert not any(item.startswith("netns:") for item in in_force)
    finally:
        server.close()


def test_secrets_and_proxies_are_scrubbed(make_sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_API_KEY", "leak-me-4471")
    monkeypatch.setenv("GITHUB_TOKEN", "leak-me-4472")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    sb = make_sandbox(env={"TASK_SEED": "7"})
    r = sb.exec(
        ["python", "-c", "import os, json; print(json.dumps(dict(os.environ)))"], timeout_s=60
    )
    assert r.returncode == 0, r.stderr
    assert "leak-me" not in r.stdout and "PROXY" not in r.stdout.upper()
    import json

    env = json.loads(r.stdout)
    assert env["HOME"] == str(sb.root)
    assert env["TASK_SEED"] == "7" and env["OMP_NUM_THREADS"] == "1"
    assert "env:scrubbed" in sb.isolation()[0]


def test_hidden_paths_are_invisible(make_sandbox, workspace: Path, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "harness").mkdir(parents=True)
    (shared / "harness" / "reference.py").write_text("ANSWER = 42\n")
    (shared / "answers.txt").write_text("expected 43\n")
    (shared / "model.txt").write_text("weights\n")
    (workspace / "expected_output.txt").write_text("secret\n")
    sb = make_sandbox(
        readonly_paths=[shared],
        hidden_paths=[
            shared / "harness",
            shared / "answers.txt",
            workspace / "expected_output.txt",
            tmp_path / "never-mounted",
        ],
    )
    script = (
        f"cat {shared}/model.txt; cat {shared}/harness/reference.py; cat {shared}/answers.txt; "
        "cat expected_output.txt; ls"
    )
    r = sb.exec(["sh", "-c", script], timeout_s=30)
    assert "weights" in r.stdout
    assert "ANSWER" not in r.stdout and "expected 43" not in r.stdout and "secret" not in r.stdout
    assert not (sb.root / "expected_output.txt").exists()
    assert (workspace / "expected_output.txt").exists()  # the source is untouched


def test_writing_outside_the_workspace_fails(make_sandbox, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    sb = make_sandbox(readonly_paths=[shared])
    marker = f"infra-agent-escape-{random.randint(0, 10**9)}"
    targets = [f"{shared}/{marker}", f"/{marker}", f"/usr/{marker}", f"{sys.prefix}/{marker}"]
    for target in targets:
        r = sb.exec(["sh", "-c", f"echo x > {target}"], timeout_s=30)
        assert r.returncode != 0, target
        assert not Path(target).exists(), target
    r = sb.exec(["sh", "-c", f"echo x > /tmp/{marker} && cat /tmp/{marker}"], timeout_s=30)
    assert r.returncode == 0 and r.stdout == "x\n"
    assert not Path(f"/tmp/{marker}").exists()  # the sandbox's /tmp is private


def test_memory_limit(make_sandbox) -> None:
    sb = make_sandbox(memory_mb=256)
    r = sb.exec(
        ["python", "-c", "x = b'x' * (512 * 2**20); print('ALLOCATED', len(x))"], timeout_s=60
    )
    assert r.returncode != 0
    assert "ALLOCATED" not in r.stdout
    # killed by the memory cgroup (docker), or MemoryError from RLIMIT_AS (local)
    assert r.killed_reason == "memory" if r.returncode == -9 else "MemoryError" in r.stderr
    # untouched (zero) pages: no resident memory, so only an address-space/data limit stops it
    r = sb.exec(
        ["python", "-c", "x = [bytearray(64 * 2**20) for _ in range(64)]; print('ALLOCATED')"],
        timeout_s=60,
    )
    assert r.returncode != 0 and "ALLOCATED" not in r.stdout and "MemoryError" in r.stderr
    small = sb.exec(["python", "-c", "x = b'x' * (16 * 2**20); print('ALLOCATED')"], timeout_s=60)
    assert small.returncode == 0 and "ALLOCATED" in small.stdout


def test_memory_limit_covers_the_whole_sandbox(make_sandbox) -> None:
    sb = make_sandbox(memory_mb=256)
    if any(item.startswith("cgroup ") for item in sb.isolation()[1]):
        pytest.skip("no writable cgroup here: only the per-process RLIMIT_AS applies")
    # Each hog holds 160 MiB until both hold theirs (a barrier of marker files), or until the
    # other has ended without (killed by the limit): no timing decides whether they overlap.
    hog = textwrap.dedent("""
        import os, sys, time
        x = b"x" * (160 * 2**20)
        open(f"ready.{sys.argv[1]}", "w").close()
        while True:
            if all(os.path.exists(f"ready.{n}") for n in "ab"):
                print("DONE", flush=True)
                break
            if os.path.exists("gone"):
                break
            time.sleep(0.01)
    """)
    sb.write_file("hog.py", hog.encode())
    both = "(python hog.py a; touch gone) & (python hog.py b; touch gone) & wait"
    r = sb.exec(["sh", "-c", both], timeout_s=120)
    assert not r.timed_out, r.stderr
    assert r.stdout.count("DONE") < 2  # 2 x 160 MiB resident cannot fit in 256 MiB


def test_spawn_gives_a_binary_pipe_and_kill_ends_its_tree(make_sandbox) -> None:
    sb = make_sandbox()
    echo = textwrap.dedent("""
        import struct, sys
        while True:
            header = sys.stdin.buffer.read(4)
            if len(header) < 4:
                break
            body = sys.stdin.buffer.read(struct.unpack("<I", header)[0])
            reply = bytes(reversed(body))
            sys.stdout.buffer.write(struct.pack("<I", len(reply)) + reply)
            sys.stdout.buffer.flush()
            print("served", len(body), file=sys.stderr, flush=True)
    """)
    proc = sb.spawn(["python", "-c", echo])
    for payload in (b"\x00\x01binary\xff", bytes(range(256)) * 300):
        proc.stdin.write(len(payload).to_bytes(4, "little") + payload)
        proc.stdin.flush()
        size = int.from_bytes(proc.stdout.read(4), "little")
        assert proc.stdout.read(size) == bytes(reversed(payload))
    # The stderr file is complete at the end of the stream, not when a stdout reply is read:
    # docker's engine sends a process's stdout and stderr from two pipes in no fixed order (a
    # stderr line read right after the last reply was once "served" without its " 9").
    proc.stdin.close()
    assert proc.stdout.read() == b""  # the end of the stream, once the worker has exited
    assert proc.handle.wait(timeout=60) == 0
    assert proc.stderr_path is not None
    assert proc.stderr_path.read_text() == "served 9\nserved 76800\n"
    sb.kill(proc)

    token = unique_sleep()
    parent = textwrap.dedent(f"""
        import subprocess, sys
        subprocess.Popen(["sleep", "{token}"])
        print("ready", flush=True)
        sys.stdin.read()
    """)
    proc = sb.spawn(["python", "-c", parent])
    assert proc.stdout.readline() == b"ready\n"  # its child has started
    assert alive_with(token) != []
    assert sb.kill(proc) >= 2  # the worker and its sleeping child
    assert alive_with(token) == []


def test_spawned_exit_status_and_end_of_stream(make_sandbox) -> None:
    sb = make_sandbox()
    proc = sb.spawn(
        ["python", "-c", "import sys; print(sys.stdin.readline().strip()); sys.exit(5)"]
    )
    proc.stdin.write(b"bye\n")
    proc.stdin.flush()
    assert proc.stdout.read() == b"bye\n"  # then end of stream
    assert proc.handle.wait(timeout=30) == 5
    assert proc.handle.poll() == 5
    sb.kill(proc)


def test_cleanup_is_complete_and_idempotent(make_sandbox, backend: str) -> None:
    sb = make_sandbox()
    token = unique_sleep()
    sb.spawn(["sleep", token])
    sb.exec(["sh", "-c", f"(setsid sleep {token} &)"], timeout_s=30)
    root = sb.root
    sb.cleanup()
    sb.cleanup()
    assert not root.exists() and not root.parent.exists()
    assert alive_with(token) == []
    assert processes.marked_pids(processes.SANDBOX_VAR, sb.id) == []  # type: ignore[attr-defined]
    if backend == "docker":
        import docker

        from infra_agent.sandboxes.docker_engine import LABEL

        mine = {"label": f"{LABEL}={sb.id}"}  # type: ignore[attr-defined]
        assert docker.from_env().containers.list(all=True, filters=mine) == []
    with pytest.raises(RuntimeError):
        sb.exec(["true"], timeout_s=5)


INTERRUPTED = """
import sys, time
from pathlib import Path
from infra_agent.sandboxes import SandboxSpec, create_sandbox
sb = create_sandbox(sys.argv[1], Path(sys.argv[2]), SandboxSpec())
sb.spawn(["sleep", sys.argv[3]])
print(sb.id, sb.root, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_process_leaves_nothing_behind(
    backend: str, workspace: Path, signum: int
) -> None:
    token = unique_sleep()
    child = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED, backend, str(workspace), token],
        stdout=subprocess.PIPE, text=True, preexec_fn=stoppable,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        sandbox_id, root = child.stdout.readline().split()
        assert Path(root).exists() and alive_with(token) != []
        child.send_signal(signum)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0
    assert not Path(root).exists()
    assert alive_with(token) == []
    assert processes.marked_pids(processes.SANDBOX_VAR, sandbox_id) == []
    if backend == "docker":
        import docker

        from infra_agent.sandboxes.docker_engine import LABEL

        mine = {"label": f"{LABEL}={sandbox_id}"}
        assert docker.from_env().containers.list(all=True, filters=mine) == []


def test_sigkilled_owner_leaves_nothing_after_the_next_sandbox(
    backend: str, workspace: Path, make_sandbox
) -> None:
    """SIGKILL runs no handler: processes die with their parent (local) and the next sandbox
    sweeps the folder and any orphaned container."""
    token = unique_sleep()
    child = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED, backend, str(workspace), token],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        sandbox_id, root = child.stdout.readline().split()
        assert alive_with(token) != []
    finally:
        child.kill()
        child.wait()
    assert Path(root).exists()  # nothing could clean up yet
    make_sandbox()
    assert not Path(root).parent.exists()
    # processes die with the parent, containers on the sweep (the limit only bounds a failure)
    assert gone_within(token, 60.0)
    if backend == "docker":
        import docker

        from infra_agent.sandboxes.docker_engine import LABEL

        orphans = docker.from_env().containers.list(
            all=True, filters={"label": f"{LABEL}={sandbox_id}"}
        )
        assert orphans == []
