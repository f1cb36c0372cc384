"""The server's own network namespace: candidate SGLang code gets a loopback and nothing else.

A source patch runs inside the server, so the server starts in a fresh network namespace with
the loopback up and no other interface (made by its confinement, `serving.isolation`:
bubblewrap's `--unshare-net`, or `unshare --net`): no route out, and the host's 127.0.0.1
services are out of reach. The driver still talks to it: network namespaces belong to threads
on Linux, so a thread that joined the server's namespace (`setns`) opens sockets there.

    network = choose("isolated")             # Network(mode="isolated") or host with a reason
    fd = open_namespace(pid)                 # once the child (or a descendant) left our namespace
    thread = NamespaceThread(fd, "server-net")   # thread.run(fn, ...): fn's sockets live there
    relay = Relay(fd, port)                  # host 127.0.0.1:relay.port -> the server's port

Joining another namespace needs CAP_SYS_ADMIN (root): without it, or without `unshare`/`ip`, the
server runs on the host network and says so (`Network.render`: "host (unconfined: <reason>)").
The namespace dies with the last process, thread, socket or descriptor that uses it.

Confined: TCP/UDP to anywhere, the host's loopback services, abstract UNIX sockets (they belong
to the network namespace). UNIX sockets with a path are file system objects: the server's file
view (`fileview`) hides them.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NetworkMode = Literal["isolated", "host"]


class Network(BaseModel):
    """Where the server's sockets live."""

    mode: NetworkMode
    reason: str | None = None
    """Why the server is not confined (mode 'host'), or None."""

    def render(self) -> str:
        if self.mode == "isolated":
            return "isolated (own network namespace: loopback only, no route out)"
        return f"host (unconfined: {self.reason})"


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why confinement cannot work on this machine, or None when it does (checked once)."""
    if os.geteuid() != 0:
        return "not root: joining the server's network namespace needs CAP_SYS_ADMIN"
    for tool in ("unshare", "ip", "sh"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed"
    return probe_failure(
        ["unshare", "--net", "--", "ip", "link", "set", "lo", "up"], "unshare --net"
    )


def probe_failure(argv: list[str], what: str) -> str | None:
    """Run a confinement's smallest command: None if it works, else why `what` failed."""
    try:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{what} failed ({exc})"
    if probe.returncode != 0:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        return f"{what} failed: {lines[-1] if lines else probe.returncode}"
    return None


def choose(requested: NetworkMode) -> Network:
    """The mode a server gets: the requested one, or host with the reason isolation failed."""
    if requested == "host":
        return Network(mode="host", reason="the deployment sets network = 'host'")
    reason = unavailable()
    return Network(mode="host", reason=reason) if reason else Network(mode="isolated")


def namespace_id(pid: int | str) -> int:
    """Inode of a process's network namespace (equal ids: the same namespace)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def open_namespace(
    pid: int,
    timeout_s: float = 30.0,
    *,
    descendants: Callable[[int], Iterable[int]] = lambda pid: (),
) -> int:
    """A descriptor of the network namespace `pid` or one of its `descendants(pid)` entered
    (unshare's child, bubblewrap's child), once it differs from ours. Close it when done."""
    mine = namespace_id("self")
    deadline = time.monotonic() + timeout_s
    while True:
        for candidate in [pid, *descendants(pid)]:
            try:
                fd = os.open(f"/proc/{candidate}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                if candidate == pid:
                    raise OSError(f"process {pid} ended before entering its namespace") from None
                continue
            if os.fstat(fd).st_ino != mine:
                return fd
            os.close(fd)
        if time.monotonic() > deadline:
            raise OSError(f"process {pid} did not enter its own network namespace")
        time.sleep(0.01)


def join(fd: int) -> None:
    """Move the calling thread (only) into the network namespace `fd` refers to."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns(CLONE_NEWNET): {os.strerror(errno)}")


def users(ns: int) -> list[str]:
    """Processes and threads (/proc/PID or /proc/PID/task/TID) inside network namespace `ns`."""
    found = []
    for proc in os.listdir("/proc"):
        if not proc.isdigit():
            continue
        try:
            for tid in os.listdir(f"/proc/{proc}/task"):
                if namespace_id(f"{proc}/task/{tid}") == ns:
                    found.append(f"/proc/{proc}/task/{tid}")
        except OSError:
            continue
    return found


def own_threads_in(ns: int) -> dict[int, str]:
    """This process's threads inside network namespace `ns`: native thread id -> name. Threads
    started by a thread inside it (e.g. a resolver pool) are inside it too."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            if namespace_id(f"self/task/{tid}") == ns:
                found[int(tid)] = names.get(int(tid), "(not a Python thread)")
        except OSError:
            continue
    return found


class NamespaceThread:
    """One daemon thread inside a network namespace that runs the callables it is given, in
    order (a daemon: an interrupted process exits without waiting for a request in flight)."""

    def __init__(self, ns_fd: int, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._joined: Future[None] = Future()
        self._thread = threading.Thread(target=self._serve, args=(ns_fd,), name=name, daemon=True)
        self._thread.start()
        self._joined.result()  # setns failed: raised here

    def _serve(self, ns_fd: int) -> None:
        try:
            join(ns_fd)
        except OSError as exc:
            self._joined.set_exception(exc)
            return
        self._joined.set_result(None)
        while (job := self._jobs.get()) is not None:
            future, fn = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on the namespace's thread; its result or its exception."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        if not self._thread.is_alive():
            raise RuntimeError("the namespace thread has ended")
        future: Future[T] = Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future.result()

    def close(self, timeout_s: float = 30.0) -> None:
        """End the thread after the job in flight (waits up to timeout_s for it)."""
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)


class Relay:
    """Host loopback port -> the server's port inside its namespace, for callers that only have a
    URL (an OpenAI client, a benchmark). The harness's own requests skip it (`Server.call`)."""

    def __init__(self, ns_fd: int, target_port: int) -> None:
        self.target_port = target_port
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))  # in the caller's (host) namespace
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(ns_fd,), name=f"server-relay-{target_port}", daemon=True
        )
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            self.close()
            raise self._error

    def _run(self, ns_fd: int) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            join(ns_fd)
            server = self._loop.run_until_complete(
                asyncio.start_server(self._pipe, sock=self._listener)
            )
        except BaseException as exc:  # noqa: BLE001 - handed to the starting thread
            self._error = exc
            self._started.set()
            return
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(server.wait_closed())
            self._loop.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                if dst.can_write_eof():
                    dst.write_eof()  # pass a half-close on; the other direction goes on
            except OSError:
                pass

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            writer.close()
            up_writer.close()

    def close(self) -> None:
        """Stop relaying and close every socket it opened (they hold the namespace)."""
        if self._thread.is_alive() and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._listener.close()


class Attachment:
    """Our hold on a confined process's network namespace: its descriptor `fd`, a thread inside
    it (`run`), and on demand a relay from the host's loopback to `port` there. The namespace
    lives while any of them does: `close()` releases them all."""

    def __init__(self, fd: int, name: str, port: int) -> None:
        self.fd = fd
        self.port = port
        try:
            self.thread = NamespaceThread(fd, name)
        except BaseException:
            os.close(fd)
            raise
        self._relay: Relay | None = None

    @property
    def id(self) -> int:
        """Inode of the namespace (equal ids: the same namespace)."""
        return os.fstat(self.fd).st_ino

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """fn(*args, **kwargs) on the namespace's thread (sockets fn opens live there)."""
        return self.thread.run(fn, *args, **kwargs)

    def relay_port(self) -> int:
        """A host loopback port relayed to `port` in the namespace (started on first use)."""
        if self._relay is None:
            self._relay = Relay(self.fd, self.port)
        return self._relay.port

    def close(self) -> None:
        """Close the relay, the thread and the descriptor, then wait (up to 15 s) for threads
        the namespace's thread started (resolver pools): the namespace dies with them."""
        if self._relay is not None:
            self._relay.close()
            self._relay = None
        self.thread.close()
        ns = self.id
        os.close(self.fd)
        deadline = time.monotonic() + 15
        while (left := own_threads_in(ns)) and time.monotonic() < deadline:
            time.sleep(0.1)
        if left:
            print(f"warning: threads still in the server's namespace: {left}", file=sys.stderr)
