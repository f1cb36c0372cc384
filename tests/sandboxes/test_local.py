"""Local-backend specifics: the `unshare` fallback without bubblewrap (root) and what it
records, and sandboxes made in a forked child."""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
from pathlib import Path

import pytest

from infra_agent.sandboxes import SandboxSpec, confinement, create_sandbox
from infra_agent.sandboxes.processes import pids_with_cmdline


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confinement, "bwrap_binary", lambda: None)


@pytest.mark.skipif(os.geteuid() != 0, reason="the unshare fallback needs root")
def test_unshare_fallback_isolates_network_and_processes(no_bwrap: None, tmp_path: Path) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    token = f"{random.randint(100000, 999999)}.{random.randint(10, 99)}"
    probe = (
        "import socket\n"
        f"try: socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')\n"
        "except OSError: print('refused')\n"
    )
    with server, create_sandbox("local", tmp_path, SandboxSpec()) as sb:
        in_force, missing = sb.isolation()
        assert "netns:unshare" in in_force and "pidns:unshare" in in_force
        assert any(m.startswith("fs:readonly-root") for m in missing)  # recorded, not hidden
        r = sb.exec(["python", "-c", probe], timeout_s=60)
        assert r.stdout == "refused\n", r.stderr
        r = sb.exec(["sh", "-c", f"(setsid sleep {token} &); id -u"], timeout_s=30)
        dropped = not any(m.startswith("user:unprivileged") for m in missing)
        assert r.returncode == 0 and int(r.stdout) == (sb.uid if dropped else 0)  # type: ignore[attr-defined]
        assert r.stray_processes >= 1
        r = sb.exec(["sh", "-c", f"(setsid sleep {token} &); sleep {token}"], timeout_s=1)
        assert r.timed_out
    assert pids_with_cmdline(token) == []


def _run_in_child(workspace: str, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    with create_sandbox("local", Path(workspace), SandboxSpec()) as sb:
        queue.put(sb.exec(["echo", "from-child"], timeout_s=30).stdout)


def test_a_forked_child_can_make_sandboxes(tmp_path: Path) -> None:
    """The launcher thread does not survive fork(); the child must get a new one, not hang."""
    with create_sandbox("local", tmp_path, SandboxSpec()) as sb:
        assert sb.exec(["echo", "parent"], timeout_s=30).stdout == "parent\n"
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_run_in_child, args=(str(tmp_path), queue))
        child.start()
        try:
            assert queue.get(timeout=60) == "from-child\n"
        finally:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
