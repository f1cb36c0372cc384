"""The streams of a docker exec attached over the engine's socket, as plain byte streams.

Without a TTY the engine multiplexes stdout and stderr on one socket, each chunk behind an
8-byte header (stream id, 3 zero bytes, big-endian length). `drain` collects both for `exec`;
`DemuxReader`/`SocketWriter` give a spawned process's stdout and stdin as file objects (stderr
frames go to a file), and `ExecHandle` answers `poll`/`wait` like subprocess.Popen.
"""

from __future__ import annotations

import io
import select
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra_agent.sandboxes.limits import MAX_OUTPUT_BYTES, signed_status


class ExecHandle:
    """A spawned exec: its id, marker and stream; `wait`/`poll` like subprocess.Popen."""

    def __init__(self, api: Any, exec_id: str, marker: str, sock: socket.socket) -> None:
        self.api, self.id, self.marker, self.sock = api, exec_id, marker, sock

    def host_pid(self, *, within_s: float = 10.0) -> int:
        """The process's host pid (the engine reports it once the exec has started)."""
        deadline = time.monotonic() + within_s
        while True:
            pid = int(self.api.exec_inspect(self.id).get("Pid") or 0)
            if pid or time.monotonic() > deadline:
                return pid
            time.sleep(0.02)

    def poll(self) -> int | None:
        info = self.api.exec_inspect(self.id)
        if info.get("Running") or info.get("ExitCode") is None:
            return None
        return signed_status(int(info["ExitCode"]))

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"exec {self.id[:12]} still running")
            time.sleep(0.05)
        return code


def send_all(sock: socket.socket, data: bytes, *, deadline: float) -> None:
    view = memoryview(data)
    while view:
        _, writable, _ = select.select([], [sock], [], max(0.0, deadline - time.monotonic()))
        if not writable:
            return
        view = view[sock.send(view[:65536]) :]


def drain(
    sock: socket.socket,
    out: bytearray,
    err: bytearray,
    *,
    deadline: float,
    idle: Callable[[], None],
) -> bool:
    """Read docker's multiplexed stream (8-byte headers) until EOF; `idle()` runs whenever
    nothing arrived for 0.2 s. False on deadline."""
    buf = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        readable, _, _ = select.select([sock], [], [], min(remaining, 0.2))
        if not readable:
            idle()
            continue
        chunk = sock.recv(65536)
        if not chunk:
            return True
        buf += chunk
        while len(buf) >= 8:
            stream, size = buf[0], struct.unpack(">I", buf[4:8])[0]
            if len(buf) < 8 + size:
                break
            target = err if stream == 2 else out
            if len(target) < MAX_OUTPUT_BYTES:
                target += buf[8 : 8 + size]
            del buf[: 8 + size]


class DemuxReader(io.RawIOBase):
    """The stdout of an attached exec as a plain byte stream; stderr frames go to a file."""

    def __init__(self, sock: socket.socket, stderr_path: Path) -> None:
        self._sock = sock
        self._stderr = open(stderr_path, "ab")
        self._pending = b""

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._sock.fileno()

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            header = self._exactly(8)
            if header is None:
                return 0
            stream, size = header[0], struct.unpack(">I", header[4:8])[0]
            payload = self._exactly(size) or b""
            if stream == 2:
                self._stderr.write(payload)
                self._stderr.flush()
            else:
                self._pending = payload
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def _exactly(self, size: int) -> bytes | None:
        data = bytearray()
        while len(data) < size:
            chunk = self._sock.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def close(self) -> None:
        self._stderr.close()
        super().close()


class SocketWriter(io.RawIOBase):
    """The stdin of an attached exec; closing it sends EOF (half-close)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._sock.fileno()

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            try:
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        super().close()
