"""RPC worker: runs candidate code inside a sandbox. Standalone (stdlib; torch only if preloaded):
copied into the sandbox with its codec (rpc_codec) and its audit guard (rpc_guard), both loaded
by path, and started there, it never imports infra_agent, and refuses to let the candidate import
it, its codec, its guard or the harness.

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
from typing import Any

# Worker functions look builtins up in this private copy: a candidate rebinding builtins.len or
# builtins.open changes nothing here (functions take __builtins__ from their globals when defined).
globals()["__builtins__"] = dict(vars(builtins))
CODEC_FILE = "_infra_rpc_codec.py"
"""The codec's file name beside the worker in the sandbox."""
GUARD_FILE = "_infra_rpc_guard.py"
"""The audit guard's file name beside the worker in the sandbox."""

if __package__:  # imported on the harness side (tests, type checking)
    from infra_agent.experiments import rpc_codec, rpc_guard
else:  # in the sandbox: the files the harness wrote beside this one, loaded by path, not by name
    import importlib.util

    def _load(filename: str) -> Any:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
        spec = importlib.util.spec_from_file_location(filename.removesuffix(".py"), path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    rpc_codec = _load(CODEC_FILE)
    rpc_guard = _load(GUARD_FILE)
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
GUARD, Guard, unguarded = rpc_guard.GUARD, rpc_guard.Guard, rpc_guard.unguarded

_gc_enable, _gc_disable, _gc_callbacks = gc.enable, gc.disable, gc.callbacks
# The C functions: signal.getsignal converts through enum (Python code that looks up patchable
# builtins such as isinstance), which would let a candidate run code in, or cheapen, bookkeeping.
_getsignal, _valid_signals = _signal.getsignal, _signal.valid_signals
_modules_get, _import_module = sys.modules.get, importlib.import_module
_gettrace, _getprofile, _setprofile = sys.gettrace, sys.getprofile, sys.setprofile
_listdir = os.listdir


class Mutation(Exception):
    """A call changed its inputs (reported as kind 'mutation')."""


# -- the worker --------------------------------------------------------------------------------


class Worker:
    """The worker's state: the arena, the captured torch entry points, the workspace folder, and
    what the interpreter looked like before any candidate code ran."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace.rstrip("/") + "/"
        self.own_files = tuple(
            f.__code__.co_filename for f in (Worker.handle, Codec.pack, Guard.__call__)
        )
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
        unguarded(_setprofile, self._watch)  # setprofile is itself an audited event
        try:
            return self._answer(self._request, body)
        finally:
            unguarded(_setprofile, None)
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
                unguarded(_import_module, name)  # e.g. torch, before any candidate code runs
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
    rpc_guard.hide_package()
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
