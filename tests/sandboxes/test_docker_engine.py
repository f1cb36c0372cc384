"""The private Docker engine: it starts, builds the sandbox image, and stops without a trace."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from infra_agent.sandboxes.docker_engine import ensure_engine, rootfs_tar
from infra_agent.sandboxes.workspace import PREFIX

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        os.geteuid() != 0
        or shutil.which("dockerd") is None
        and not os.path.exists("/usr/sbin/dockerd"),
        reason="a private dockerd needs root and Debian's docker.io",
    ),
]


def test_engine_starts_builds_the_image_and_stops_without_a_trace() -> None:
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-engine-test-"))
    engine = ensure_engine(root)
    try:
        client = engine.client()
        assert client.ping()
        image = client.images.get(engine.image)
        assert image.attrs["Os"] == "linux"
        pid = engine.process.pid if engine.process else 0
        assert Path(f"/proc/{pid}").exists()
    finally:
        engine.stop()
    engine.stop()  # idempotent
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert not root.exists()
    with open("/proc/self/mounts") as mounts:
        assert str(root) not in mounts.read()


def test_rootfs_has_a_shell_and_an_unprivileged_user() -> None:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(rootfs_tar())) as tar:
        names = set(tar.getnames())
        assert {"bin/busybox", "bin/sh", "etc/passwd", "tmp", "usr"} <= names
        passwd = tar.extractfile("etc/passwd")
        assert passwd is not None and b"nobody:x:65534" in passwd.read()
