"""RPC worker: runs candidate code inside a sandbox. Standalone (stdlib; torch only if preloaded):
copied into the sandbox and started there, it never imports infra_agent, and refuses to let the
candidate import it or the harness. The harness side imports its codec (`pack`, `unpack`).

Protocol (over the process's original stdin/stdout, which the candidate cannot print into):
each frame is an 8-byte big-endian length and a payload, both ways in one safe format: b"R", an
8-byte header length, a JSON header, then each raw tensor buffer with its 8-byte length (see
`pack`). Nothing is unpickled on either side, so bytes a candidate controls cannot run code in the
harness, and the worker decodes requests with its own captured functions, not with machinery
(pickle, torch.load) the candidate could have patched.
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
import ctypes
import gc
import importlib
import json
import json.encoder
import json.scanner
import operator
import os
import struct
import sys
import threading
import traceback
from typing import Any

# Worker functions look builtins up in this private copy: a candidate rebinding builtins.len or
# builtins.open changes nothing here (functions take __builtins__ from their globals when defined).
globals()["__builtins__"] = dict(vars(builtins))

HEADER = struct.Struct(">Q")
BLOCKED = ("infra_agent", "harness", "_infra_rpc_worker")
SCALARS = (type(None), bool, int, float, str)
DTYPES = (
    "float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "bool", "complex64", "complex128",
)  # fmt: skip
MAX_DEPTH = 64

_is = operator.is_
_list_iter, _list_len, _list_copy = list.__iter__, list.__len__, list.copy
_tuple_iter, _dict_items, _dict_len = tuple.__iter__, dict.items, dict.__len__
_int, _float, _str = int.__int__, float.__float__, str.__str__
_type_name = type.__dict__["__name__"].__get__
_string_at = ctypes.string_at
_gc_enable, _gc_disable, _gc_callbacks = gc.enable, gc.disable, gc.callbacks
# The C functions: signal.getsignal converts through enum (Python code that looks up patchable
# builtins such as isinstance), which would let a candidate run code in, or cheapen, bookkeeping.
_getsignal, _valid_signals = _signal.getsignal, _signal.valid_signals
_modules_get, _import_module = sys.modules.get, importlib.import_module
_gettrace, _getprofile, _setprofile = sys.gettrace, sys.getprofile, sys.setprofile
_format_exception = traceback.format_exception
_json_encoder = getattr(json.encoder, "c_make_encoder", None)
_json_scanner = getattr(json.scanner, "c_make_scanner", None)


class Mutation(Exception):
    """A call changed its inputs (reported as kind 'mutation')."""


# -- the codec, shared with the harness side ---------------------------------------------------


class Codec:
    """Plain values <-> one frame. `tensor_bytes(value)` returns (raw bytes, dtype name, shape)
    for a tensor it accepts, else None; `make_tensor(raw, dtype, shape)` builds one."""

    def __init__(self, tensor_bytes: Any = None, make_tensor: Any = None) -> None:
        self.tensor_bytes = tensor_bytes
        self.make_tensor = make_tensor
        # CPython's C encoder and scanner, built once: no Python code of the json module (which
        # the candidate could patch) runs when a frame is read or written.
        if _json_encoder is not None and _json_scanner is not None:
            encoder = _json_encoder(None, _refuse, json.encoder.encode_basestring_ascii,
                                    None, ":", ",", False, False, True)  # fmt: skip
            scanner = _json_scanner(json.JSONDecoder())
            self._dumps: Any = lambda value: "".join(encoder(value, 0))
            self._loads: Any = lambda text: _scanned(scanner(text, 0), text)
        else:
            self._dumps = json.JSONEncoder(separators=(",", ":"), default=_refuse).encode
            self._loads = json.loads

    def pack(self, message: dict[str, Any]) -> bytes:
        buffers: list[bytes] = []
        header = self._dumps(self.plain(message, buffers, 0)).encode()
        parts = [b"R", HEADER.pack(len(header)), header]
        for buf in buffers:
            parts += [HEADER.pack(len(buf)), buf]
        return b"".join(parts)

    def plain(self, value: Any, buffers: list[bytes], depth: int) -> Any:
        """A JSON-able copy of exact types; tensors become {"__tensor__": i, dtype, shape} and a
        buffer. Subclasses of the built-in types are read through their base type's slots, never
        their own methods (issubclass of the real type: no __class__ property is consulted)."""
        if depth > MAX_DEPTH:
            raise ValueError("value nests too deeply")
        kind = type(value)
        if kind in SCALARS:
            return value
        if issubclass(kind, (list, tuple)):
            items = _list_iter(value) if issubclass(kind, list) else _tuple_iter(value)
            out = [v if type(v) in SCALARS else self.plain(v, buffers, depth + 1) for v in items]
            return out if issubclass(kind, list) else {"__tuple__": out}
        if issubclass(kind, dict):
            plain: dict[str, Any] = {}
            for key, item in _dict_items(value):
                if type(key) is not str:
                    raise TypeError("dict keys must be strings")
                plain[key] = self.plain(item, buffers, depth + 1)
            return {"__dict__": plain}
        if self.tensor_bytes is not None:
            found = self.tensor_bytes(value)
            if found is not None:
                raw, dtype, shape = found
                buffers.append(raw)
                return {"__tensor__": len(buffers) - 1, "dtype": dtype, "shape": shape}
        reads: tuple[tuple[type, Any], ...] = ((int, _int), (float, _float), (str, _str))
        for base, read in reads:
            if issubclass(kind, base):
                return read(value)  # a subclass: its base value, through the base's slot
        raise TypeError(f"cannot return a {_type_name(kind)}")

    def unpack(self, payload: bytes) -> dict[str, Any]:
        view = memoryview(payload)
        if view[:1] != b"R":
            raise ValueError("unknown frame format")
        try:
            size = int.from_bytes(view[1:9], "big")
            header = self._loads(bytes(view[9 : 9 + size]).decode())
            pos = 9 + size
            buffers: list[memoryview] = []
            while pos < len(view):
                n = int.from_bytes(view[pos : pos + 8], "big")
                buffers.append(view[pos + 8 : pos + 8 + n])
                pos += 8 + n
            message = self.restore(header, buffers, 0)
        except (KeyError, IndexError, TypeError, RuntimeError, ValueError, StopIteration) as exc:
            raise ValueError(f"malformed frame ({_type_name(type(exc))}: {exc})") from None
        if type(message) is not dict:
            raise ValueError("frame is not a message")
        return message

    def restore(self, value: Any, buffers: list[memoryview], depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError("value nests too deeply")
        if type(value) is list:
            return [v if type(v) in SCALARS else self.restore(v, buffers, depth + 1) for v in value]
        if type(value) is not dict:
            return value
        if "__tuple__" in value:
            return tuple(self.restore(v, buffers, depth + 1) for v in value["__tuple__"])
        if "__dict__" in value:
            return {
                str(k): self.restore(v, buffers, depth + 1) for k, v in value["__dict__"].items()
            }
        if "__tensor__" in value and self.make_tensor is not None:
            shape = [int(d) for d in value["shape"]]
            return self.make_tensor(buffers[int(value["__tensor__"])], str(value["dtype"]), shape)
        raise ValueError("malformed value in frame")


def _scanned(found: tuple[Any, int], text: str) -> Any:
    if found[1] != len(text):
        raise ValueError("trailing data after the header")
    return found[0]


def _refuse(value: Any) -> Any:
    raise TypeError(f"cannot encode a {_type_name(type(value))}")


# -- torch, captured once it is loaded and before candidate code runs --------------------------


class Tensors:
    """Torch's C entry points, captured after preload: the worker never looks a method up on a
    tensor the candidate may have touched (instance attributes, a patched torch.Tensor)."""

    def __init__(self, torch: Any) -> None:
        base = getattr(torch._C, "TensorBase", None) or torch._C._TensorBase
        self.tensor_type = torch.Tensor
        self.dtypes = {n: getattr(torch, n) for n in DTYPES if hasattr(torch, n)}
        self.names = {v: k for k, v in self.dtypes.items()}
        self.frombuffer, self.empty = torch.frombuffer, torch.empty
        self.reshape, self.detach, self.cpu = base.reshape, base.detach, base.cpu
        self.contiguous = base.contiguous
        self.data_ptr, self.numel, self.element_size = base.data_ptr, base.numel, base.element_size
        self.size, self.stride = base.size, base.stride
        self.dtype_of = base.__dict__["dtype"].__get__
        self.get_num_threads = torch.get_num_threads
        self.get_num_interop_threads = torch.get_num_interop_threads
        c = torch._C
        self.function_modes = getattr(c, "_len_torch_function_stack", None)
        self.dispatch_modes = getattr(c, "_len_torch_dispatch_stack", None)
        self.codec = Codec(self.tensor_bytes, self.make_tensor)

    def raw(self, t: Any) -> bytes:
        n = self.numel(t) * self.element_size(t)
        return _string_at(self.data_ptr(t), n) if n else b""

    def tensor_bytes(self, value: Any) -> tuple[bytes, str, list[int]] | None:
        if type(value) is not self.tensor_type:
            return None
        t = self.contiguous(self.cpu(self.detach(value)))
        return self.raw(t), self.names[self.dtype_of(t)], list(self.size(t))

    def make_tensor(self, raw: memoryview, dtype: str, shape: list[int]) -> Any:
        if dtype not in self.dtypes:
            raise ValueError(f"unknown tensor dtype {dtype!r}")
        if len(raw) == 0:
            return self.empty(shape, dtype=self.dtypes[dtype])
        return self.reshape(self.frombuffer(bytearray(raw), dtype=self.dtypes[dtype]), shape)

    def pool_threads(self) -> int:
        """Threads torch's pools may start lazily: intra-op plus inter-op plus one helper."""
        return int(self.get_num_threads()) + int(self.get_num_interop_threads()) + 1

    def modes_left(self) -> list[str]:
        found = []
        if self.function_modes is not None and self.function_modes():
            found.append("a torch function mode")
        if self.dispatch_modes is not None and self.dispatch_modes():
            found.append("a torch dispatch mode")
        return found


# -- inputs: what a call may not change ------------------------------------------------------


class Snapshot:
    """What an input looked like when it was decoded: for each mutable object in it, its exact
    type and (by identity) its items, and for tensors their layout and bytes."""

    def __init__(self, value: Any, tensors: Tensors | None) -> None:
        self.tensors = tensors
        self.parts: list[tuple[Any, ...]] = []
        self._take(value)

    def _take(self, value: Any) -> None:
        kind = type(value)
        if kind is list:
            self.parts.append((value, list, _list_copy(value)))
            children: Any = value
        elif kind is tuple:
            children = value
        elif kind is dict:
            items = list(_dict_items(value))
            self.parts.append((value, dict, items))
            children = [v for _, v in items]
        elif self.tensors is not None and kind is self.tensors.tensor_type:
            t = self.tensors
            layout = (
                t.data_ptr(value),
                tuple(t.size(value)),
                tuple(t.stride(value)),
                t.dtype_of(value),
            )
            self.parts.append((value, kind, layout, t.raw(value)))  # fmt: skip
            return
        else:
            return
        for child in children:
            if type(child) not in SCALARS:
                self._take(child)

    def changed(self) -> str | None:
        """How the value changed since the snapshot, or None."""
        for part in self.parts:
            obj, kind = part[0], part[1]
            if type(obj) is not kind:
                return f"a {_type_name(kind)} became a {_type_name(type(obj))}"
            if kind is list:
                old = part[2]
                if _list_len(obj) != len(old) or not all(map(_is, _list_iter(obj), old)):
                    return "a list's items were replaced"
            elif kind is dict:
                old = part[2]
                if _dict_len(obj) != len(old) or not all(
                    _is(k, ok) and _is(v, ov)
                    for (k, v), (ok, ov) in zip(_dict_items(obj), old, strict=True)
                ):
                    return "a dict's items were replaced"
            else:
                t = self.tensors
                assert t is not None
                layout = (
                    t.data_ptr(obj),
                    tuple(t.size(obj)),
                    tuple(t.stride(obj)),
                    t.dtype_of(obj),
                )
                if layout != part[2]:
                    return "a tensor's storage or shape changed"
                if t.raw(obj) != part[3]:
                    return "a tensor's contents were written"
        return None


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
        self.own_file = Worker.handle.__code__.co_filename
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
            return {"ok": False, "kind": "crash", **_described(exc)}

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
            if name.startswith(self.workspace) and name != self.own_file and len(self.foreign) < 3:
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


def _described(exc: BaseException) -> dict[str, str]:
    """An exception in words and its traceback; formatting runs stdlib code a candidate may have
    patched (and its own __str__), so a failure here leaves the words it could get."""
    name = _type_name(type(exc))
    try:
        error = f"{name}: {str.__str__(str(exc))}"
    except BaseException:  # noqa: BLE001 - the candidate's __str__ or a patched builtin
        error = f"{name} (its message could not be read)"
    try:
        text = "".join(_format_exception(type(exc), exc, exc.__traceback__))[-4000:]
    except BaseException:  # noqa: BLE001 - traceback's own code, patched or recursing
        text = "(traceback unavailable)"
    return {"error": error, "traceback": text}


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
        header = _read_exact(read, proto_in, HEADER.size)
        if header is None:
            return
        body = _read_exact(read, proto_in, HEADER.unpack(header)[0])
        if body is None or body[:1] == b"X":
            return
        data = worker.handle(body[:1], int.from_bytes(body[1:9], "big"), body[9:])
        _write_all(write, proto_out, HEADER.pack(len(data)) + data)


def _read_exact(read: Any, fd: int, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        chunk = read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _write_all(write: Any, fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[write(fd, view) :]


if __name__ == "__main__":
    main()
