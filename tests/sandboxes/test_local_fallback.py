"""The local backend without bubblewrap: `unshare` namespaces (root), and what it records."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest
from infra_agent.sandboxes import SandboxSpec, confinement, create_sandbox
from infra_agent.sandboxes.processes import pids_with_cmdline

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the unshare fallback needs root")


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(confinement, "bwrap_binary", lambda: None)


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
