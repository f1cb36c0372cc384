"""Runs inside the server: wraps one engine function and keeps some of its calls' arguments.

This file is copied into the server's SGLang overlay as `sglang/_infra_agent_capture.py`, and the
target function's module gets two lines at its end (`serving.instruments.capture.instrument_workspace`):

    from sglang._infra_agent_capture import install as _infra_agent_capture
    _infra_agent_capture(globals(), "RMSNorm.forward", OUT, KEEP, MAX_TENSOR_BYTES, MAX_CALL_BYTES)

so the wrapper is in place before any importer sees the name. It imports nothing of infra-agent
(the server cannot see it): the standard library and torch only.

Nothing is recorded until the harness creates `OUT/armed` (after the server's start-up warm-up):
then every call is counted (an 8-byte counter in `OUT/count-PID`, memory-mapped: a call costs a
store, not a write), and of the calls the first `KEEP // 2` are kept, the rest spread over the
whole workload (each later call at a stride that doubles, dropping every other kept one, when
the spread half is full). A kept call is `call-PID-N.pt` (torch.save of its arguments: tensors
detached, on the CPU, cloned; a tensor over `max_tensor_bytes`, or past `max_call_bytes` for the
call, is stored as its shape and dtype only) and `call-PID-N.json` (what the arguments were,
what the call returned, how long it took). A failure to record is written to `OUT/error-PID`
and never breaks the call.
"""

from __future__ import annotations

import functools
import json
import mmap
import os
import struct
import threading
import time
from typing import Any

ARMED = "armed"


def describe(value: Any, depth: int = 0) -> Any:
    """A JSON description of a value: tensors as {'tensor': [shape], 'dtype': ..}, small scalars
    as themselves, containers element by element (at most 16), anything else by its type."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"tensor": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value[:200]
    if isinstance(value, (list, tuple)) and depth < 3:
        return [describe(v, depth + 1) for v in list(value)[:16]]
    if isinstance(value, dict) and depth < 3:
        return {str(k): describe(v, depth + 1) for k, v in list(value.items())[:16]}
    return {"object": f"{type(value).__module__}.{type(value).__qualname__}"}


class Stored:
    """A tensor stored as its shape and dtype only (over the size limit)."""

    def __init__(self, shape: list[int], dtype: str) -> None:
        self.shape, self.dtype = shape, dtype


class Unpicklable:
    """An attribute of a kept module that cannot be pickled (a process group, a lock...)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __repr__(self) -> str:
        return f"<not captured: {self.kind}>"


_MODULES: dict[int, Any] = {}
"""id(live module) -> its picklable copy (made once: a module's state does not change in serving)."""


def module_copy(module: Any) -> Any:
    """A copy of an nn.Module (or of an SGLang object) that pickles: the same class (so a replay
    calls that arm's code), parameters, buffers and submodules (copied so too), plain
    attributes; an attribute that does not pickle becomes `Unpicklable`, and a method bound to
    the module is bound to the copy."""
    import pickle
    import types

    found = _MODULES.get(id(module))
    if found is not None:
        return found
    copy = object.__new__(type(module))
    _MODULES[id(module)] = copy
    state: dict[str, Any] = {}
    for key, value in module.__dict__.items():
        if key == "_modules":
            state[key] = {k: None if m is None else module_copy(m) for k, m in value.items()}
        elif key in ("_parameters", "_buffers"):
            state[key] = dict(value)
        elif isinstance(value, types.MethodType) and value.__self__ is module:
            state[key] = types.MethodType(value.__func__, copy)
        else:
            try:
                pickle.dumps(value)
                state[key] = value
            except Exception:  # noqa: BLE001 - anything that does not pickle is left out
                state[key] = Unpicklable(f"{type(value).__module__}.{type(value).__qualname__}")
    copy.__dict__.update(state)
    return copy


def detached(value: Any, budget: list[int], max_tensor_bytes: int) -> Any:
    """`value` with every tensor detached, on the CPU and cloned (or a `Stored` placeholder when
    it is over `max_tensor_bytes` or the call's remaining `budget[0]` bytes); modules and other
    objects as they are (pickled by torch.save with their state), modules as `module_copy`."""
    import torch

    if isinstance(value, torch.Tensor):
        size = value.numel() * value.element_size()
        if size > max_tensor_bytes or size > budget[0]:
            return Stored(list(value.shape), str(value.dtype).replace("torch.", ""))
        budget[0] -= size
        return value.detach().to("cpu", copy=True)
    if isinstance(value, (list, tuple)):
        items = [detached(v, budget, max_tensor_bytes) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: detached(v, budget, max_tensor_bytes) for k, v in value.items()}
    if isinstance(value, torch.nn.Module) or _engine_object(value):
        return module_copy(value)
    return value


def _engine_object(value: Any) -> bool:
    """An instance of an SGLang class (an attention backend as a method's `self`): copied
    attribute by attribute, since one unpicklable attribute (a model runner holding modules) made
    torch.save refuse the whole call ('cannot pickle module object')."""
    kind = type(value)
    return hasattr(value, "__dict__") and (kind.__module__ or "").startswith("sglang.")


class Recorder:
    """The calls of one wrapped function in this process (see the module docstring)."""

    def __init__(self, out: str, keep: int, max_tensor_bytes: int, max_call_bytes: int) -> None:
        self.out, self.keep = out, max(2, keep)
        self.max_tensor_bytes, self.max_call_bytes = max_tensor_bytes, max_call_bytes
        self.armed = False
        self.calls = 0
        self.stride = 1
        self.spread: list[int] = []
        self.lock = threading.Lock()
        self.counter: mmap.mmap | None = None

    def arm(self) -> bool:
        if not self.armed and os.path.exists(os.path.join(self.out, ARMED)):
            path = os.path.join(self.out, f"count-{os.getpid()}")
            with open(path, "wb") as f:
                f.write(b"\0" * 8)
            with open(path, "r+b") as f:
                self.counter = mmap.mmap(f.fileno(), 8)
            self.armed = True
        return self.armed

    def wanted(self, n: int) -> bool:
        """Keep call `n` (0-based)? The first keep//2, then every `stride`-th."""
        first = self.keep // 2
        if n < first:
            return True
        if (n - first) % self.stride:
            return False
        if len(self.spread) >= self.keep - first:  # full: drop every other, double the stride
            dropped, self.spread = self.spread[1::2], self.spread[::2]
            for m in dropped:
                self.remove(m)
            self.stride *= 2
            return (n - first) % self.stride == 0
        return True

    def remove(self, n: int) -> None:
        for ext in ("pt", "json"):
            try:
                os.remove(os.path.join(self.out, f"call-{os.getpid()}-{n}.{ext}"))
            except OSError:
                pass

    def call(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not self.arm():
            return fn(*args, **kwargs)
        with self.lock:
            n = self.calls
            self.calls += 1
            assert self.counter is not None
            struct.pack_into("<q", self.counter, 0, self.calls)
            keep = self.wanted(n)
        if not keep:
            return fn(*args, **kwargs)
        try:
            saved = detached((args, kwargs), [self.max_call_bytes], self.max_tensor_bytes)
        except Exception as exc:  # noqa: BLE001 - recording must never break the call
            self.fail(exc)
            return fn(*args, **kwargs)
        t0 = time.perf_counter_ns()
        result = fn(*args, **kwargs)
        elapsed = time.perf_counter_ns() - t0
        try:
            self.save(n, saved, args, kwargs, result, elapsed)
        except Exception as exc:  # noqa: BLE001
            self.remove(n)
            self.fail(exc)
        return result

    def save(self, n: int, saved: Any, args: Any, kwargs: Any, result: Any, ns: int) -> None:
        import torch

        base = os.path.join(self.out, f"call-{os.getpid()}-{n}")
        torch.save({"args": saved[0], "kwargs": saved[1]}, base + ".pt")
        meta = {
            "index": n,
            "pid": os.getpid(),
            "args": describe(args),
            "kwargs": describe(kwargs),
            "result": describe(result),
            "live_ns": ns,
            "stored_only": _placeholders(saved),
        }
        with open(base + ".json", "w") as f:
            json.dump(meta, f)
        with self.lock:
            if n >= self.keep // 2:
                self.spread.append(n)

    def fail(self, exc: BaseException) -> None:
        with open(os.path.join(self.out, f"error-{os.getpid()}"), "a") as f:
            f.write(f"{type(exc).__name__}: {exc}\n")


def _placeholders(value: Any) -> int:
    if isinstance(value, Stored):
        return 1
    if isinstance(value, (list, tuple)):
        return sum(_placeholders(v) for v in value)
    if isinstance(value, dict):
        return sum(_placeholders(v) for v in value.values())
    return 0


def install(
    namespace: dict[str, Any],
    qualname: str,
    out: str,
    keep: int,
    max_tensor_bytes: int,
    max_call_bytes: int,
) -> None:
    """Wrap `qualname` ('f' or 'Class.method') of the module whose globals are `namespace`."""
    owner_name, _, name = qualname.rpartition(".")
    owner: Any = namespace[owner_name] if owner_name else None
    original = getattr(owner, name, None) if owner is not None else namespace.get(name)
    if original is None:  # an inherited method that is not there: say so, never break the import
        try:
            with open(os.path.join(out, f"error-{os.getpid()}"), "a") as f:
                f.write(f"{qualname} does not exist (not defined nor inherited)\n")
        except OSError:
            pass
        return
    if owner is not None:  # the function as the class holds it (staticmethod stays one)
        raw = owner.__dict__.get(name, original)
    else:
        raw = original
    recorder = Recorder(out, keep, max_tensor_bytes, max_call_bytes)
    target = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw

    @functools.wraps(target)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return recorder.call(target, args, kwargs)

    wrapper.__infra_agent_recorder__ = recorder  # type: ignore[attr-defined]
    if isinstance(raw, staticmethod):
        setattr(owner, name, staticmethod(wrapper))
    elif isinstance(raw, classmethod):
        setattr(owner, name, classmethod(wrapper))
    elif owner is not None:
        setattr(owner, name, wrapper)
    else:
        namespace[name] = wrapper
