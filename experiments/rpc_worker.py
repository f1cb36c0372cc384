"""RPC worker: runs candidate code inside a sandbox. Standalone (stdlib; torch only if the
candidate's code imports it): copied into the sandbox and started there, it never imports
infra_agent, and refuses to let the candidate import it or the harness.

Protocol (over the process's original stdin/stdout, which the candidate cannot print into):
each frame is an 8-byte big-endian length and a payload.
- Requests (harness -> worker, trusted direction): pickled dicts
  {"op": "call"|"put"|"ping"|"exit", "nonce": int, "target": "module:function",
   "args": [...], "kwargs": {...}, "name": str, "value": ...}.
  Arguments may contain {"__arena__": name}: a value stored earlier with "put".
- Responses (worker -> harness, untrusted): a JSON header and raw tensor buffers (see
  `_encode`) of {"nonce": int, "ok": bool, "value": ..., "kind": str, "error": str,
  "threads": int, "children": int, "pool": int}. Values may be None, bool, int, float, str,
  lists, tuples, dicts with string keys, and torch tensors (dense, any device, sent as bytes).
  The harness decodes them with json and torch.frombuffer: nothing is unpickled, so
  candidate-controlled bytes cannot run code in the harness (and it is faster than torch.save /
  torch.load).
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import struct
import sys
import traceback
from typing import Any, BinaryIO

HEADER = struct.Struct(">Q")
BLOCKED = ("infra_agent", "harness")


class _Blocker:
    """Meta-path finder that refuses the package and the harness."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in BLOCKED:
            if GUARD.active:
                GUARD.violations.append(f"importing {name} (the package or the harness)")
            raise ImportError(f"{name} is not available to candidate code")
        return None


def _hide_package() -> None:
    sys.meta_path[:] = [
        f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f).lower()
    ]
    sys.meta_path.insert(0, _Blocker())
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]


AUDIT_EVENTS = {
    "network": ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"),
    "processes": ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                  "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn"),
    "introspection": ("gc.get_objects", "gc.get_referrers", "gc.get_referents",
                      "sys._current_frames", "sys.settrace", "sys.setprofile"),
}  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class Guard:
    """Audit hook (cannot be removed once added): while candidate code runs, denied operations
    raise PermissionError and are recorded, so the call is reported as a rule violation even if
    the candidate swallows the exception. It backs up the static rules against obfuscation."""

    def __init__(self) -> None:
        self.active = False
        self.events: dict[str, str] = {}
        self.forbidden: list[str] = []
        self.exempt: list[str] = []
        self.writable: list[str] = []
        self.violations: list[str] = []

    def configure(self, config: dict[str, list[str]]) -> None:
        for group in config.get("deny", []):
            for event in AUDIT_EVENTS.get(group, ()):
                self.events[event] = group
        self.forbidden = [os.path.realpath(p) for p in config.get("forbidden", [])]
        self.exempt = [os.path.realpath(p) for p in config.get("exempt", [])]
        self.writable = [os.path.realpath(p) for p in config.get("writable", [])]

    def _deny(self, what: str) -> None:
        self.violations.append(what)
        raise PermissionError(f"infra-agent sandbox: {what} is not allowed")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        group = self.events.get(event)
        if group is not None:
            self._deny(f"{event} (rule group '{group}')")
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.fsdecode(args[0])
            path = os.path.realpath(path)
            mode, flags = (
                (args[1] if len(args) > 1 else "r") or "r",
                args[2] if len(args) > 2 else 0,
            )
            writing = any(c in str(mode) for c in "wax+") or bool((flags or 0) & _WRITE_FLAGS)
            if _under(path, self.forbidden) and not _under(path, self.exempt):
                self._deny(f"opening {path} (the harness or the package)")
            if writing and not _under(path, self.writable):
                self._deny(f"writing {path} (outside the workspace)")


GUARD = Guard()


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _self_report() -> tuple[int, int]:
    """Threads of this process and live child processes (a secondary signal: the harness also
    inspects /proc from outside when it can see the worker)."""
    threads = children = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                children += len(f.read().split())
    except OSError:
        pass
    return threads, children


def _pool_threads() -> int:
    """Threads torch's compute pools may start lazily if torch is loaded, else 0: the intra-op
    and inter-op pool sizes plus one helper thread (OpenMP starts size - 1 workers). How many
    threads started after warm-up the harness tolerates; it still measures that they are idle."""
    torch = sys.modules.get("torch")
    try:
        if torch is None:
            return 0
        return int(torch.get_num_threads()) + int(torch.get_num_interop_threads()) + 1
    except Exception:  # noqa: BLE001 - a partly imported or replaced torch
        return 0


def _plain(value: Any, buffers: list[bytes], depth: int = 0) -> Any:
    """JSON-able structure; tensors become {"__tensor__": index, dtype, shape} + a raw buffer."""
    if depth > 64:
        raise ValueError("result nests too deeply")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_plain(v, buffers, depth + 1) for v in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_plain(v, buffers, depth + 1) for v in value]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError("dict keys must be strings")
        return {"__dict__": {k: _plain(v, buffers, depth + 1) for k, v in value.items()}}
    torch = sys.modules.get("torch")
    if torch is not None and type(value) is torch.Tensor:
        t = value.detach().to("cpu").contiguous()
        buffers.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return {"__tensor__": len(buffers) - 1, "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape)}  # fmt: skip
    raise TypeError(f"cannot return a {type(value).__name__}")


def _encode(message: dict[str, Any]) -> bytes:
    """b"R" + 8-byte header length + JSON header + 8-byte length and bytes of each buffer."""
    buffers: list[bytes] = []
    header = json.dumps({"message": _plain(message, buffers)}).encode()
    parts = [b"R", HEADER.pack(len(header)), header]
    for buf in buffers:
        parts += [HEADER.pack(len(buf)), buf]
    return b"".join(parts)


def _resolve(value: Any, arena: dict[str, Any]) -> Any:
    if isinstance(value, dict) and set(value) == {"__arena__"}:
        return arena[value["__arena__"]]
    return value


def _handle(request: dict[str, Any], arena: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "ping":
        GUARD.configure(request.get("guard", {}))
        for name in request.get("preload", []):
            importlib.import_module(name)  # e.g. torch, before any candidate code runs
        return {"value": "pong"}
    if op == "put":
        old = arena.get(request["name"])
        value = request["value"]
        copy_ = getattr(old, "copy_", None)
        same = getattr(old, "shape", None) == getattr(value, "shape", 0) and getattr(
            old, "dtype", None
        ) == getattr(value, "dtype", 0)
        if copy_ is not None and same:
            copy_(value)  # same object, new content: caches keyed on identity go stale
        else:
            arena[request["name"]] = value
        return {"value": None}
    if op == "call":
        module_name, _, func_name = request["target"].partition(":")
        GUARD.active = True  # importing the candidate's module runs its code too
        try:
            func = getattr(importlib.import_module(module_name), func_name)
        finally:
            GUARD.active = False
        args = [_resolve(a, arena) for a in request.get("args", [])]
        kwargs = {k: _resolve(v, arena) for k, v in request.get("kwargs", {}).items()}
        GUARD.active = True
        try:
            return {"value": func(*args, **kwargs)}
        finally:
            GUARD.active = False
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    proto_in = os.fdopen(os.dup(0), "rb", buffering=0)
    proto_out = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # the candidate's prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    sys.path.insert(0, os.getcwd())
    _hide_package()
    sys.addaudithook(GUARD)
    arena: dict[str, Any] = {}
    while True:
        header = _read_exact(proto_in, HEADER.size)
        if header is None:
            return
        body = _read_exact(proto_in, HEADER.unpack(header)[0])
        if body is None:
            return
        request = pickle.loads(body)
        if request["op"] == "exit":
            return
        try:
            response = {"ok": True, **_handle(request, arena)}
        except MemoryError:
            response = {"ok": False, "kind": "memory", "error": "MemoryError"}
        except BaseException as exc:  # noqa: BLE001 - report every failure of candidate code
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            response = {"ok": False, "kind": "crash", "error": f"{type(exc).__name__}: {exc}"}
            response["traceback"] = text[-4000:]
        if GUARD.violations:
            response = {"ok": False, "kind": "violation", "error": "; ".join(GUARD.violations[:3])}
            GUARD.violations.clear()
        response["nonce"] = request["nonce"]
        response["threads"], response["children"] = _self_report()
        response["pool"] = _pool_threads()
        try:
            payload = _encode(response)
        except MemoryError:
            payload = _encode({"ok": False, "kind": "memory", "error": "MemoryError",
                               "nonce": request["nonce"]})  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a result that cannot be sent safely
            payload = _encode({"ok": False, "kind": "protocol", "nonce": request["nonce"],
                               "error": f"result cannot be returned: {type(exc).__name__}: {exc}"})  # fmt: skip
        proto_out.write(HEADER.pack(len(payload)) + payload)
        proto_out.flush()


if __name__ == "__main__":
    main()
