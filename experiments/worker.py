"""The harness side of the RPC worker: `RpcWorker` implements `tasks.harness.Worker`.

It copies `rpc_worker.py`, its codec (`rpc_codec.py`) and its audit guard (`rpc_guard.py`) into
a sandbox, starts it there (isolated mode: nothing in the workspace shadows the worker's own
modules), and talks to it in one safe format both ways (`rpc_codec.Codec`: a JSON header and raw tensor bytes, never pickle). Every call has a deadline; past it the sandboxed
process tree is killed (CandidateFailure kind='timeout'). The process watch starts before any
candidate code can run (before preloads and the first import): after each call child processes
still alive, threads beyond an idle compute pool, or any thread but the worker's own using CPU
while no call runs (see procwatch) is a CandidateFailure of kind 'violation'; a call that changed
its inputs, where the task does not declare in-place semantics, is an IncorrectOutput.
"""

from __future__ import annotations

import os
import queue
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any

from infra_agent.experiments.rpc_codec import Codec
from infra_agent.experiments.rpc_worker import CODEC_FILE, GUARD_FILE
from infra_agent.feedback.pyprofile import WORKER_PREFIX
from infra_agent.sandboxes.base import Sandbox, SandboxProcess
from infra_agent.sandboxes.procwatch import ProcessWatch
from infra_agent.tasks.harness import CandidateFailure, IncorrectOutput

WORKER_SOURCE = Path(__file__).with_name("rpc_worker.py")
CODEC_SOURCE = Path(__file__).with_name("rpc_codec.py")
GUARD_SOURCE = Path(__file__).with_name("rpc_guard.py")
WORKER_FILE = "_infra_rpc_worker.py"
"""Name of the worker script inside the sandbox workspace copy (not editable by patches)."""
assert all(f.startswith(WORKER_PREFIX) for f in (WORKER_FILE, CODEC_FILE, GUARD_FILE))
HEADER_BYTES = 8
MAX_RESPONSE_BYTES = 1 << 30
STARTUP_TIMEOUT_S = 120.0


def ref(name: str) -> dict[str, str]:
    """An argument that refers to a value stored in the worker with `put` (inputs need not be
    re-sent for every call; each put replaces the value with a fresh object)."""
    return {"__arena__": name}


def _tensor_bytes(value: Any) -> tuple[bytes, str, list[int]] | None:
    torch = sys.modules.get("torch")  # no torch loaded here: the value is not a tensor
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    t = value.detach().to("cpu").contiguous()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return raw, str(t.dtype).removeprefix("torch."), list(t.shape)


def _make_tensor(raw: memoryview, dtype: str, shape: list[int]) -> Any:
    import torch

    kind = getattr(torch, dtype, None)
    if not isinstance(kind, torch.dtype):
        raise ValueError(f"unknown tensor dtype {dtype!r}")
    if len(raw) == 0:
        return torch.empty(shape, dtype=kind)
    return torch.frombuffer(bytearray(raw), dtype=kind).reshape(shape)


CODEC = Codec(_tensor_bytes, _make_tensor)


def _load_response(payload: bytes) -> dict[str, Any]:
    """Decode a response. Never unpickles: a malicious candidate controls these bytes."""
    return CODEC.unpack(payload)


class RpcWorker:
    """One worker process in one sandbox. Not thread-safe; one call at a time."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        python: str | None = None,
        call_timeout_s: float = 60.0,
        preload: list[str] | None = None,
        guard: dict[str, list[str]] | None = None,
        inplace: bool = False,
        background: bool = False,
    ) -> None:
        """Start the worker; `preload` names modules imported before any candidate code runs
        (e.g. torch, so its import time is not charged to the first call); `guard` configures the
        worker's audit hook: {"deny": rule groups, "forbidden": paths never opened, "exempt":
        paths inside those that may be, "writable": the only folders written}; `inplace`: calls
        may change their inputs; `background`: threads may outlive calls and work between them."""
        self.sandbox = sandbox
        self.call_timeout_s = call_timeout_s
        sandbox.write_file(CODEC_FILE, CODEC_SOURCE.read_bytes())  # loaded by path
        sandbox.write_file(GUARD_FILE, GUARD_SOURCE.read_bytes())  # loaded by path
        sandbox.write_file(WORKER_FILE, WORKER_SOURCE.read_bytes())
        python = python or getattr(sandbox, "python", None) or sys.executable
        self.process: SandboxProcess = sandbox.spawn([python, "-I", "-B", WORKER_FILE])
        self._frames: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self.dead: str | None = None
        self.received_ns = 0
        self.watch = ProcessWatch(self.process.pid, WORKER_FILE, background=background)
        hello = {"op": "hello", "guard": guard or {}, "inplace": inplace}
        pong = self._request(hello, timeout_s=STARTUP_TIMEOUT_S)
        # Watched from here: before preloads and before any candidate code is imported.
        self.watch.started(reported_threads=int(pong.get("threads", 0) or 0))
        self._request({"op": "preload", "modules": preload or []}, timeout_s=STARTUP_TIMEOUT_S)
        self._last_threads = 0
        self._last_pool = 0

    # -- transport ---------------------------------------------------------------------------

    def _read_loop(self) -> None:
        stream: Any = self.process.stdout
        try:
            while True:
                header = _read_exact(stream, HEADER_BYTES)
                if header is None:
                    break
                size = int.from_bytes(header, "big")
                if size > MAX_RESPONSE_BYTES:
                    break
                body = _read_exact(stream, size)
                if body is None:
                    break
                self._frames.put(body)
        except (OSError, ValueError):
            pass
        self._frames.put(None)

    def log_tail(self, lines: int = 30) -> str:
        path = self.process.stderr_path
        if path is None or not Path(path).is_file():
            return ""
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])

    def _fail(self, message: str, kind: str) -> CandidateFailure:
        self.dead = message
        try:
            self.sandbox.kill(self.process)
        except Exception:  # noqa: BLE001 - already gone
            pass
        return CandidateFailure(message, kind=kind, log_tail=self.log_tail())

    def _request(self, request: dict[str, Any], *, timeout_s: float | None) -> dict[str, Any]:
        return self._exchange(*_encode(request), timeout_s=timeout_s)

    def _exchange(self, nonce: int, data: bytes, *, timeout_s: float | None) -> dict[str, Any]:
        """Send one encoded request and wait for its response (the time it arrived, by the
        harness's clock, is left in `received_ns`)."""
        if self.dead is not None:
            raise CandidateFailure(f"worker is not running ({self.dead})", kind="crash")
        stdin: Any = self.process.stdin
        try:
            stdin.write(len(data).to_bytes(HEADER_BYTES, "big") + data)
            stdin.flush()
        except (OSError, ValueError) as exc:
            raise self._fail(f"worker exited (cannot send: {exc})", "crash") from exc
        limit = timeout_s if timeout_s is not None else self.call_timeout_s
        try:
            payload = self._frames.get(timeout=limit)
            self.received_ns = time.perf_counter_ns()
        except queue.Empty:
            raise self._fail(f"call did not return within {limit:g} s", "timeout") from None
        if payload is None:
            code = _returncode(self.process)
            kind = "memory" if code in (-9, 137) and "MemoryError" in self.log_tail() else "crash"
            raise self._fail(f"worker died (exit status {code})", kind)
        try:
            response = _load_response(payload)
        except CandidateFailure as exc:
            raise self._fail(str(exc), "protocol") from exc
        except Exception as exc:  # noqa: BLE001 - refused by the safe loader
            raise self._fail(
                f"worker sent a response the safe loader refused: {exc}", "protocol"
            ) from exc
        if response.get("nonce") != nonce:
            raise self._fail("worker answered out of turn (forged or stale response)", "protocol")
        if not response.get("ok"):
            kind = str(response.get("kind", "crash"))
            message = str(response.get("error", "candidate failed"))
            tail = str(response.get("traceback", ""))[-2000:] or self.log_tail()
            if kind == "memory":
                raise self._fail(f"candidate ran out of memory ({message})", "memory")
            if kind == "violation":
                raise self._fail(f"candidate attempted {message}", "violation")
            if kind == "mutation":
                raise IncorrectOutput(message)
            raise CandidateFailure(f"candidate raised {message}", kind=kind, log_tail=tail)
        return response

    # -- Worker protocol -----------------------------------------------------------------------

    def put(self, name: str, value: Any, *, timeout_s: float | None = None) -> None:
        """Store `value` in the worker under `name` (a fresh object, replacing the last one)."""
        self.check_idle(call=False)
        self._request({"op": "put", "name": name, "value": value}, timeout_s=timeout_s)

    def call(self, target: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        return self.timed_call(target, *args, timeout_s=timeout_s, **kwargs)[0]

    def timed_call(
        self, target: str, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> tuple[Any, float]:
        request = {"op": "call", "target": target, "args": list(args), "kwargs": kwargs}
        nonce, data = _encode(request)
        self.check_idle()  # before the clock starts: reading /proc is not the candidate's time
        start = time.perf_counter_ns()
        response = self._exchange(nonce, data, timeout_s=timeout_s)
        elapsed_s = (self.received_ns - start) / 1e9
        self._last_threads = int(response.get("threads", 0) or 0)
        pool = response.get("pool", 0)
        self._last_pool = pool if isinstance(pool, int) and 0 <= pool <= 4096 else 0
        self.check_leftovers()
        return response.get("value"), elapsed_s

    # -- run-time rules ---------------------------------------------------------------------

    def check_idle(self, *, call: bool = True) -> None:
        """Before a request: the worker's other threads must have stayed idle since the last
        call returned (see ProcessWatch.before_request)."""
        problem = self.watch.before_request(call=call) if self.dead is None else None
        if problem is not None:
            raise self._fail(problem, "violation")

    def check_leftovers(self) -> None:
        problem = self.watch.problem(
            reported_threads=self._last_threads, pool_threads=self._last_pool
        )
        if problem is not None:
            raise self._fail(problem, "violation")

    def close(self) -> None:
        if self.dead is None:
            try:
                stdin: Any = self.process.stdin
                stdin.write((9).to_bytes(HEADER_BYTES, "big") + b"X" + bytes(8))
                stdin.flush()
            except (OSError, ValueError):
                pass
        self.dead = self.dead or "closed"
        try:
            self.sandbox.kill(self.process)
        except Exception:  # noqa: BLE001 - already gone
            pass


def _encode(request: dict[str, Any]) -> tuple[int, bytes]:
    """(nonce, frame body) of a request: b"C" for a call, b"O" for other operations."""
    nonce = secrets.randbits(62)
    kind = b"C" if request["op"] == "call" else b"O"
    try:
        return nonce, kind + nonce.to_bytes(8, "big") + CODEC.pack(request)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"cannot send this value to the worker: {exc}") from exc


def _read_exact(stream: Any, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = stream.read(n) if hasattr(stream, "read") else os.read(stream, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _returncode(process: SandboxProcess) -> int | None:
    handle = process.handle
    wait = getattr(handle, "wait", None)
    if wait is None:
        return None
    try:
        return int(wait(timeout=2))
    except Exception:  # noqa: BLE001 - unknown handle type or still running
        return None
