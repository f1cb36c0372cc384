"""A private Docker engine for tests and CI: its own `dockerd`, data root and socket.

`ensure_engine(root)` starts Debian's `dockerd` with everything under `root` (no bridge, no
iptables: sandbox containers have no network anyway), waits until it answers, removes sandbox
containers left by an earlier crash, and builds the sandbox image locally when absent (registry
pulls are impossible): a rootfs with a static busybox, `docker import`ed. Python is not in the
image; the docker backend bind-mounts the host's /usr, interpreter prefix and virtual
environment read-only at their host paths. `EngineHandle.stop()` stops dockerd, kills whatever
it left (containerd shims), unmounts and removes `root`.
"""

from __future__ import annotations

import ctypes
import io
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra_agent.config import SandboxSettings
from infra_agent.errors import UserError
from infra_agent.sandboxes import cleanup, processes

LABEL = "infra-agent.sandbox"
"""Label on every sandbox container (value: the sandbox id)."""
OWNER_LABEL = "infra-agent.owner"
"""Label naming the process that owns a sandbox container ('<boot id>/<pid>')."""
START_TIMEOUT_S = 60.0
_PR_SET_PDEATHSIG = 1
_MAX_SOCKET_PATH = 90  # unix socket paths must stay under 108 bytes, containerd's included


def default_image() -> str:
    return SandboxSettings().docker_image


@dataclass
class EngineHandle:
    """A running dockerd started by `ensure_engine` (or one found already answering there)."""

    root: Path
    socket: Path
    exec_root: Path
    process: subprocess.Popen[bytes] | None
    image: str
    storage_driver: str
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    @property
    def base_url(self) -> str:
        """DOCKER_HOST value for this engine."""
        return f"unix://{self.socket}"

    def client(self):  # -> docker.DockerClient (the SDK is optional, so no import-time type)
        import docker

        return docker.DockerClient(base_url=self.base_url, timeout=60)

    def stop(self) -> None:
        """Stop dockerd (SIGTERM, then SIGKILL after 20 s), kill its leftovers, remove `root`."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.process is not None:
                _remove_sandbox_containers(self)
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(self.process.pid, signal.SIGKILL)
                    self.process.wait()
                _kill_mentioning(self.root, self.exec_root)
                _unmount_under(self.root, self.exec_root)
                shutil.rmtree(self.root, ignore_errors=True)
                shutil.rmtree(self.exec_root, ignore_errors=True)
        finally:
            cleanup.unregister(self)

    def cleanup(self) -> None:  # the cleanup registry's protocol
        self.stop()


def engine_root() -> Path:
    """A fresh folder for a private engine, named like a sandbox folder so that a run killed by
    SIGKILL has it swept by the next one."""
    from infra_agent.sandboxes.workspace import PREFIX

    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-engine-"))


_PRIVATE: list[EngineHandle] = []
"""This process's own engine, started on first need (see `private_engine`)."""


def private_engine() -> EngineHandle:
    """This process's private dockerd (started once, with the sandbox image), DOCKER_HOST
    pointed at it; stopped when the process exits, by Ctrl-C, SIGTERM or SIGHUP too (the
    cleanup registry), and by the kernel if the process is killed (PR_SET_PDEATHSIG)."""
    if not _PRIVATE or _PRIVATE[0]._stopped:
        _PRIVATE[:] = [ensure_engine(engine_root())]
    os.environ["DOCKER_HOST"] = _PRIVATE[0].base_url
    return _PRIVATE[0]


def ensure_engine(root: Path, *, image: str | None = None) -> EngineHandle:
    """A dockerd answering on `root`/docker.sock with the sandbox image built. Raises UserError
    (with dockerd's last log lines) if it cannot start."""
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    image = image or default_image()
    dockerd = shutil.which("dockerd") or (
        "/usr/sbin/dockerd" if os.path.exists("/usr/sbin/dockerd") else None
    )
    if dockerd is None:
        raise UserError(
            "dockerd is not installed (Debian package docker.io; see .ci/setup-system.sh)"
        )
    short = len(str(root)) < _MAX_SOCKET_PATH - 40
    exec_root = root / "exec" if short else Path(tempfile.mkdtemp(prefix="iad-"))
    socket = (root if short else exec_root) / "docker.sock"
    log_path = root / "dockerd.log"
    errors = []
    for driver in ("overlay2", "vfs"):
        handle = _start(dockerd, root, exec_root, socket, log_path, driver, image)
        if _wait_ready(handle):
            break
        errors.append(f"{driver}: {_tail(log_path)}")
        handle.stop()
        root.mkdir(parents=True, exist_ok=True)
        exec_root.mkdir(parents=True, exist_ok=True)
    else:
        raise UserError("dockerd did not start: " + " | ".join(errors))
    try:
        _remove_sandbox_containers(handle)
        build_image(handle.client(), image)
    except BaseException:
        handle.stop()
        raise
    return handle


def _start(
    dockerd: str, root: Path, exec_root: Path, socket: Path, log: Path, driver: str, image: str
) -> EngineHandle:
    argv = [
        dockerd,
        f"--data-root={root / 'data'}",
        f"--exec-root={exec_root}",
        f"--pidfile={root / 'dockerd.pid'}",
        f"--host=unix://{socket}",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-masq=false",
        "--bridge=none",
        f"--storage-driver={driver}",
    ]
    with open(log, "ab") as out:
        # SIGTERM when the process that started it dies, even by SIGKILL: dockerd then stops
        # its containers and exits instead of outliving a killed test run.
        process = processes.launch(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, preexec_fn=_terminate_with_parent,
        )  # fmt: skip
    handle = EngineHandle(root, socket, exec_root, process, image, driver, log)
    cleanup.register(handle)
    return handle


def _terminate_with_parent() -> None:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _wait_ready(handle: EngineHandle) -> bool:
    import docker

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert handle.process is not None
        if handle.process.poll() is not None:
            return False
        if handle.socket.exists():
            try:
                client = docker.DockerClient(base_url=handle.base_url, timeout=5)
                if client.ping():
                    return True
            except Exception:
                pass
        time.sleep(0.2)
    return False


def build_image(client, image: str) -> bool:  # client: docker.DockerClient
    """Import the busybox rootfs as `image` unless it exists. True if it was built now."""
    import docker

    try:
        client.images.get(image)
        return False
    except docker.errors.ImageNotFound:
        pass
    repository, _, tag = image.partition(":")
    client.api.import_image_from_data(rootfs_tar(), repository=repository, tag=tag or "latest")
    client.images.get(image)
    return True


def rootfs_tar() -> bytes:
    """A minimal root filesystem: static busybox as /bin/sh, mount points, nobody in passwd."""
    busybox = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.path.exists(p)), None)
    if busybox is None:
        raise UserError("busybox is not installed (Debian package busybox-static)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder, mode in [("bin", 0o755), ("etc", 0o755), ("usr", 0o755), ("tmp", 0o1777),
                             ("proc", 0o555), ("sys", 0o555), ("dev", 0o755), ("run", 0o755)]:  # fmt: skip
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for name, target in [("bin/sh", "busybox"), ("lib", "usr/lib"), ("lib64", "usr/lib64")]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        files = {
            "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
            "etc/group": "root:x:0:\nnogroup:x:65534:\n",
        }
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _remove_sandbox_containers(handle: EngineHandle) -> int:
    try:
        client = handle.client()
        leftovers = client.containers.list(all=True, filters={"label": LABEL})
    except Exception:
        return 0
    for container in leftovers:
        try:
            container.remove(force=True)
        except Exception:
            pass
    return len(leftovers)


def _kill_mentioning(*paths: Path) -> None:
    """SIGKILL processes whose command line mentions one of `paths` (containerd, its shims)."""
    needles = [str(p).encode() for p in paths]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(n in cmdline for n in needles):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def _unmount_under(*paths: Path) -> None:
    prefixes = [str(p) + "/" for p in paths]
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted(points, key=len, reverse=True):
        if any(point.startswith(p) for p in prefixes):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " / ".join(line[-200:] for line in text[-lines:])


def owner() -> str:
    """'<boot id>/<pid>' of this process: a container whose owner is gone is an orphan."""
    return f"{_boot_id()}/{os.getpid()}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def remove_orphans(client: Any) -> int:
    """Remove sandbox containers whose owning process (on this machine) died without cleanup,
    e.g. by SIGKILL, which no handler can see."""
    removed = 0
    boot = _boot_id()
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        owner = container.labels.get(OWNER_LABEL, "")
        owner_boot, _, pid = owner.partition("/")
        if owner_boot == boot and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                container.remove(force=True)
                removed += 1
            except Exception:  # another process removed it first
                pass
    return removed
