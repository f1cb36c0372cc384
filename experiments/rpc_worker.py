"""RPC worker: runs candidate code inside a sandbox. Standalone (stdlib; torch only if preloaded):
copied into the sandbox with its codec (rpc_codec, loaded by path) and started there, it never
imports infra_agent, and refuses to let the candidate import it, its codec or the harness.

Protocol (over the process's original stdin/stdout, which the candidate cannot print into):
frames in rpc_codec's format, both ways.
- Requests: {"op": "hello"|"preload"|"put"|"call"|"exit", "nonce": int, "target": "mod:func",
  "args": [...], "kwargs": {...}, "name": str, "value": ...}. Arguments may contain
  {"__arena__": name}: a value stored earlier with "put".
- Responses: {"nonce", "ok", "value", "kind", "error", "threads", "children", "pool"}. Values
  may be None, bool, int, float, str, lists, tuples, dicts with string keys and torch tensors.

Candidate code runs only inside a call, which the harness times: importing the target module,
the call itself, and freeing what the candidate touched. Every other operation (put, decoding,
encoding, self-report) treats objects the candidate could have touched as untrusted: it replaces
them and never dispatches on them (exact types, base-class slots, functions captured before any
candidate code ran, a private copy of builtins), runs with the audit guard active and the
garbage collector off, and once candidate code may exist (after the first call) under a profiler
that reports any frame of workspace code as a violation. Preloads (trusted imports such as torch)
happen only before the first call. After each call the worker refuses hooks the candidate left
behind through which its code could run later (signal handlers, gc callbacks, trace or profile
functions, torch function or dispatch modes) and inputs the call changed (unless the task
declares in-place semantics).
"""

from __future__ import annotations

import _signal
import builtins
import gc
import importlib
import os
import sys
import threading
from typing import Any

# Worker functions look builtins up in this private copy: a candidate rebinding builtins.len or
# builtins.open changes nothing here (functions take __builtins__ from their globals when defined).
globals()["__builtins__"] = dict(vars(builtins))
CODEC_FILE = "_infra_rpc_codec.py"
"""The codec's file name beside the worker in the sandbox."""
BLOCKED = ("infra_agent", "harness", "_infra_rpc_worker", "_infra_rpc_codec")

if __package__:  # imported on the harness side (tests, type checking)
    from infra_agent.experiments import rpc_codec
else:  # in the sandbox: the codec the harness wrote beside this file, loaded by path, not by name
    import importlib.util

    def _load_codec() -> Any:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), CODEC_FILE)
        spec = importlib.util.spec_from_file_location("_infra_rpc_codec", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    rpc_codec = _load_codec()
HEADER = rpc_codec.HEADER
Codec = rpc_codec.Codec
Tensors = rpc_codec.Tensors
Snapshot = rpc_codec.Snapshot
_list_len, _type_name = rpc_codec._list_len, rpc_codec._type_name
read_frame_bytes, write_all, described = (
    rpc_codec.read_frame_bytes,
    rpc_codec.write_all,
    rpc_codec.described,
)

_gc_enable, _gc_disable, _gc_callbacks = gc.enable, gc.disable, gc.callbacks
# The C functions: signal.getsignal converts through enum (Python code that looks up patchable
# builtins such as isinstance), which would let a candidate run code in, or cheapen, bookkeeping.
_getsignal, _valid_signals = _signal.getsignal, _signal.valid_signals
_modules_get, _import_module = sys.modules.get, importlib.import_module
_gettrace, _getprofile, _setprofile = sys.gettrace, sys.getprofile, sys.setprofile


class Mutation(Exception):
    """A call changed its inputs (reported as kind 'mutation')."""


# -- the audit guard ---------------------------------------------------------------------------

AUDIT_EVENTS = {
    "network": ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"),
    "processes": ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                  "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn"),
    "introspection": ("gc.get_objects", "gc.get_referrers", "gc.get_referents",
                      "sys._current_frames", "sys.settrace", "sys.setprofile"),
}  # fmt: skip
ALWAYS_DENIED = {
    "sys.addaudithook": "an audit hook (it would run candidate code in every operation)"
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_os_open, _os_close, _readlink, _getcwd = os.open, os.close, os.readlink, os.getcwd
_listdir, _get_ident, _O_PATH = os.listdir, threading.get_ident, os.O_PATH
_trusted: set[int] = set()
"""Threads doing the worker's own audited work at this moment (the O_PATH opens of `_realpath`,
preloads, installing the put profiler): the guard lets their events pass. Every other thread is
guarded from the first request on, between requests too (a thread the task lets live between
calls is no less the candidate's)."""


def _realpath(path: str | bytes) -> str:
    """`path` with symlinks resolved, by the kernel (an O_PATH descriptor and its /proc link),
    with no Python code of os.path (a candidate may patch it, or the builtins it uses). A path
    that does not exist yet resolves through its folder."""
    me = _get_ident()
    _trusted.add(me)  # our own O_PATH opens are not the candidate's
    try:
        return _resolved(path)
    finally:
        _trusted.discard(me)


def _resolved(path: str | bytes) -> str:
    if not isinstance(path, str):  # the audit event's argument: exactly str or bytes
        path = bytes.decode(path, "utf-8", "surrogateescape")
    if not path.startswith("/"):
        path = _getcwd() + "/" + path
    head, tail = path, ""
    while head:
        try:
            fd = _os_open(head, _O_PATH)
        except OSError:
            head, _, name = head.rpartition("/")
            tail = name + ("/" + tail if tail else "")
            continue
        try:
            real = _readlink(f"/proc/self/fd/{fd}")
        finally:
            _os_close(fd)
        return real.rstrip("/") + ("/" + tail if tail else "") if real != "/" else "/" + tail
    return "/" + tail


def _own(function: Any, *args: Any) -> Any:
    """Run the worker's own audited work in this thread only, unguarded (see `_trusted`)."""
    me = _get_ident()
    _trusted.add(me)
    try:
        return function(*args)
    finally:
        _trusted.discard(me)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class Guard:
    """Audit hook (cannot be removed once added): while active, denied operations raise
    PermissionError and are recorded, so the call is reported as a rule violation even if the
    candidate swallows the exception. It backs up the static rules against obfuscation. Active
    from the first request on, in every thread but one doing the worker's own trusted work
    (`_trusted`): during every operation and between operations alike. A violation a thread
    commits between requests is reported by the next one."""

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
        self.forbidden = [_realpath(p) for p in config.get("forbidden", [])]
        self.exempt = [_realpath(p) for p in config.get("exempt", [])]
        self.writable = [_realpath(p) for p in config.get("writable", [])]

    def _deny(self, what: str) -> None:
        self.violations.append(what)
        raise PermissionError(f"infra-agent sandbox: {what} is not allowed")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or _get_ident() in _trusted:
            return
        if event in ALWAYS_DENIED:
            self._deny(f"{event}: {ALWAYS_DENIED[event]}")
        group = self.events.get(event)
        if group is not None:
            self._deny(f"{event} (rule group '{group}')")
        if event == "open" and args and type(args[0]) in (str, bytes):
            path = _realpath(args[0])
            mode, flags = (
                (args[1] if len(args) > 1 else "r") or "r",
                args[2] if len(args) > 2 else 0,
            )
            writing = (type(mode) is str and any(c in mode for c in "wax+")) or bool(
                (flags if type(flags) is int else 0) & _WRITE_FLAGS
            )
            if _under(path, self.forbidden) and not _under(path, self.exempt):
                self._deny(f"opening {path} (the harness or the package)")
            if writing and not _under(path, self.writable):
                self._deny(f"writing {path} (outside the workspace)")


GUARD = Guard()


class _Blocker:
    """Meta-path finder that refuses the package, the harness and this worker."""

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


# -- the worker --------------------------------------------------------------------------------


class Worker:
    """The worker's state: the arena, the captured torch entry points, the workspace folder, and
    what the interpreter looked like before any candidate code ran."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace.rstrip("/") + "/"
        self.own_files = (Worker.handle.__code__.co_filename, Codec.pack.__code__.co_filename)
        self.arena: dict[str, tuple[Any, Snapshot | None]] = {}
        self.graveyard: list[Any] = []
        """Values put replaced: freed inside the next call, so a finalizer the candidate attached
        to one runs on the clock and under the guard, never during a put."""
        self.tensors: Tensors | None = None
        self.codec = Codec()
        self.inplace = False
        self.foreign: list[str] = []
        self.called = False
        """Set by the first call: from then on candidate code may exist in the process."""
        self.signals = {s: _getsignal(s) for s in _valid_signals()}

    def handle(self, kind: bytes, nonce: int, body: bytes) -> bytes:
        """One request (kind b"C": a call, b"O": any other operation) -> the response frame."""
        GUARD.active = True  # and stays on: between requests other threads may run
        if kind == b"C":
            _gc_enable()  # the collector (and what it frees) runs only inside calls
            try:
                self.graveyard.clear()
                response = self._answer(self._call, body)
                response["leftovers"] = self.leftovers()
                data = self._pack(response, nonce)
                del response  # what the candidate returned is freed here, inside the call
                return data
            finally:
                self.graveyard.clear()
                _gc_disable()
        return self._pack(self._outside_call(body), nonce)

    def _answer(self, op: Any, body: bytes) -> dict[str, Any]:
        try:
            return {"ok": True, **op(body)}
        except MemoryError:
            return {"ok": False, "kind": "memory", "error": "MemoryError"}
        except Mutation as exc:
            return {"ok": False, "kind": "mutation", "error": str(exc)}
        except BaseException as exc:  # noqa: BLE001 - report every failure of candidate code
            return {"ok": False, "kind": "crash", **described(exc)}

    def _outside_call(self, body: bytes) -> dict[str, Any]:
        """Any operation but a call. Once candidate code may exist in the process (after the
        first call), under a profiler that reports frames of workspace code: candidate code has
        no business running here (its objects are never dispatched on)."""
        if not self.called:
            return self._answer(self._request, body)
        self.foreign = []
        _own(_setprofile, self._watch)  # setprofile is itself an audited event
        try:
            return self._answer(self._request, body)
        finally:
            _own(_setprofile, None)
            if self.foreign:
                GUARD.violations.append(
                    "running code outside its call (" + ", ".join(self.foreign) + ")"
                )

    def _watch(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            name = frame.f_code.co_filename
            if (
                name.startswith(self.workspace)
                and name not in self.own_files
                and len(self.foreign) < 3
            ):
                self.foreign.append(f"{name.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    def _request(self, body: bytes) -> dict[str, Any]:
        message = self.codec.unpack(body)
        op = message["op"]
        if op == "hello":
            GUARD.configure(message.get("guard", {}))
            self.inplace = bool(message.get("inplace", False))
            return {"value": "hello"}
        if op == "preload":
            if self.called:
                raise ValueError("preload after candidate code ran")
            # Trusted imports before any candidate code exists in the process (the workspace is
            # not on sys.path yet), so the guard has nothing to catch: torch writes temp files.
            for name in message.get("modules", []):
                _own(_import_module, name)  # e.g. torch, before any candidate code runs
            if "torch" in sys.modules and self.tensors is None:
                self.tensors = Tensors(sys.modules["torch"])
                self.codec = self.tensors.codec
            if self.workspace.rstrip("/") not in sys.path:
                sys.path.insert(0, self.workspace.rstrip("/"))  # only now: nothing shadows ours
            return {"value": None}
        if op == "put":
            old = self.arena.get(message["name"])
            if old is not None:
                self.graveyard.append(old)  # replaced, never refilled through its own methods
            value = message["value"]
            self.arena[message["name"]] = (value, self._snapshot(value))
            return {"value": None}
        raise ValueError(f"unknown op {op!r}")

    def _snapshot(self, value: Any) -> Snapshot | None:
        return None if self.inplace else Snapshot(value, self.tensors)

    def _call(self, body: bytes) -> dict[str, Any]:
        self.called = True
        message = self.codec.unpack(body)
        module_name, _, func_name = str(message["target"]).partition(":")
        # An imported module is looked up directly: import_module runs importlib's Python code,
        # which calls builtins a candidate may have patched, on every call.
        module = _modules_get(module_name)
        if module is None:
            module = _import_module(module_name)  # candidate code: its import is timed
        func = getattr(module, func_name)
        inputs: list[tuple[str, Snapshot | None]] = []
        args = []
        for i, raw in enumerate(message.get("args", [])):
            value, snap = self._resolve(raw)
            inputs.append((f"argument {i + 1}", snap))
            args.append(value)
        kwargs = {}
        for key, raw in message.get("kwargs", {}).items():
            value, snap = self._resolve(raw)
            inputs.append((f"keyword argument {key!r}", snap))
            kwargs[key] = value
        del message
        result = func(*args, **kwargs)
        del args, kwargs
        for where, snap in inputs:
            how = snap.changed() if snap is not None else None
            if how is not None:
                raise Mutation(
                    f"the call changed its {where} ({how}); the task does not declare "
                    "in-place semantics"
                )
        return {"value": result}

    def _resolve(self, raw: Any) -> tuple[Any, Snapshot | None]:
        if type(raw) is dict and len(raw) == 1 and "__arena__" in raw:
            return self.arena[str(raw["__arena__"])]
        return raw, self._snapshot(raw)

    def leftovers(self) -> list[str]:
        """Hooks the candidate left installed through which its code could run outside a call."""
        found = [f"a handler for signal {int(s)}" for s, h in self.signals.items()
                 if _getsignal(s) is not h]  # fmt: skip
        if _list_len(_gc_callbacks):
            found.append("a garbage-collector callback")
        if _gettrace() is not None or _getprofile() is not None:
            found.append("a trace or profile function")
        if self.tensors is not None:
            found += self.tensors.modes_left()
        return found

    def _pack(self, response: dict[str, Any], nonce: int) -> bytes:
        left = response.pop("leftovers", None)
        if GUARD.violations:
            response = {"ok": False, "kind": "violation", "error": "; ".join(GUARD.violations[:3])}
            GUARD.violations.clear()
        elif left:
            response = {"ok": False, "kind": "violation",
                        "error": "leaving " + ", ".join(left) + " installed after the call"}  # fmt: skip
        response["nonce"] = nonce
        response["threads"], response["children"], response["pool"] = _self_report(self.tensors)
        try:
            return self.codec.pack(response)
        except MemoryError:
            return self.codec.pack({"ok": False, "kind": "memory", "error": "MemoryError",
                                    "nonce": nonce})  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - a result that cannot be sent safely
            return self.codec.pack({"ok": False, "kind": "protocol", "nonce": nonce,
                                    "error": f"result cannot be returned: {_type_name(type(exc))}: {exc}"})  # fmt: skip


def _self_report(tensors: Tensors | None) -> tuple[int, int, int]:
    """Threads of this process, live child processes and torch's pool size (a secondary signal:
    the harness also inspects /proc from outside when it can see the worker)."""
    threads = children = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
        for tid in _listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                children += len(f.read().split())
    except OSError:
        pass
    try:
        pool = tensors.pool_threads() if tensors is not None else 0
    except Exception:  # noqa: BLE001 - a broken torch
        pool = 0
    return threads, children, pool


def main() -> None:
    proto_in, proto_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # the candidate's prints go to stderr, never into the protocol
    sys.stdout = sys.stderr
    _hide_package()
    sys.modules["__main__"] = type(sys)("__main__")  # `import __main__` reaches nothing here
    worker = Worker(os.getcwd())
    sys.addaudithook(GUARD)
    _gc_disable()
    read, write = os.read, os.write
    while True:
        header = read_frame_bytes(read, proto_in, HEADER.size)
        if header is None:
            return
        body = read_frame_bytes(read, proto_in, HEADER.unpack(header)[0])
        if body is None or body[:1] == b"X":
            return
        data = worker.handle(body[:1], int.from_bytes(body[1:9], "big"), body[9:])
        write_all(write, proto_out, HEADER.pack(len(data)) + data)


if __name__ == "__main__":
    main()
