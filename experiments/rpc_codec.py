"""The RPC worker's codec: one safe format both ways, and the worker's readers of values a
candidate may have touched. Standalone (stdlib; torch only once preloaded): the harness imports
it, and writes it beside the worker in the sandbox, where the worker loads it by path before any
candidate code runs (see rpc_worker).

Each frame is an 8-byte big-endian length and a payload: b"R", an 8-byte header length, a JSON
header, then each raw tensor buffer with its 8-byte length (see `Codec.pack`). Nothing is
unpickled on either side, so bytes a candidate controls cannot run code in the harness, and the
worker decodes requests with its own captured functions, not with machinery (pickle,
torch.load) the candidate could have patched. Values may be None, bool, int, float, str, lists,
tuples, dicts with string keys and torch tensors. `Tensors` reads and builds tensors through
torch's C entry points captured at preload; `Snapshot` tells whether a call changed its inputs.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import json.encoder
import json.scanner
import operator
import struct
import traceback
from typing import Any

# Functions here look builtins up in this private copy: a candidate rebinding builtins.len or
# builtins.isinstance changes nothing here (functions take __builtins__ from their globals).
globals()["__builtins__"] = dict(vars(builtins))

HEADER = struct.Struct(">Q")
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
_format_exception = traceback.format_exception
_json_encoder = getattr(json.encoder, "c_make_encoder", None)
_json_scanner = getattr(json.scanner, "c_make_scanner", None)


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


# -- frames on descriptors, and failures in words -----------------------------------------------


def read_frame_bytes(read: Any, fd: int, n: int) -> bytes | None:
    """Exactly `n` bytes from descriptor `fd` through `read` (os.read, captured), or None at
    end of input."""
    chunks: list[bytes] = []
    while n:
        chunk = read(fd, min(n, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def write_all(write: Any, fd: int, data: bytes) -> None:
    """All of `data` to descriptor `fd` through `write` (os.write, captured)."""
    view = memoryview(data)
    while view:
        view = view[write(fd, view) :]


def described(exc: BaseException) -> dict[str, str]:
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
