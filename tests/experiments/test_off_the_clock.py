"""Work off the clock: candidate code may run only inside its call, which the harness times.

The worker's other operations (put, decoding arguments, encoding results) never dispatch on an
object the candidate could have touched, free such objects only inside a call, and refuse hooks
through which candidate code could run later (signal handlers, gc callbacks, audit hooks, torch
modes). Each cheat writes a marker file in its workspace when its code runs where it must not, or
returns a wrong answer unless it did: the assertions are on markers, verdicts of wrong outputs and
rule violations, never on timings.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infra_agent.experiments import run_experiment
from infra_agent.experiments.worker import RpcWorker, ref
from infra_agent.sandboxes import Sandbox, SandboxSpec, create_sandbox
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.harness import CandidateFailure, IncorrectOutput
from infra_agent.tasks.registry import find_task

# -- the red team's cheat: precompute in the untimed refill of an arena value ----------------

ARENA_HOOK = '''"""A projection whose answer is computed while the harness stages the next inputs."""

import torch

_SEEN = {}
_READY = {}


def _hook(tensor: torch.Tensor) -> None:
    refill = tensor.copy_

    def copy_(value: torch.Tensor) -> torch.Tensor:
        refill(value)
        x, w = _SEEN["x"], _SEEN["w"]
        _READY["out"] = (x.unsqueeze(2) * w.unsqueeze(0)).sum(dim=1)  # off the clock
        return tensor

    tensor.copy_ = copy_


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if "x" not in _SEEN:
        _SEEN.update(x=x, w=w)
        _hook(w)  # the harness refills x, then w: both are fresh when w's copy_ runs
    out = _READY.pop("out", None)
    return out if out is not None else torch.zeros(x.shape[0], w.shape[1])
'''


@pytest.mark.slow
def test_precomputing_while_inputs_are_staged_is_impossible(
    backend: str, no_static_rules: None, make_patch
) -> None:
    """Judged IMPROVED 8.05x when put refilled an arena tensor through its own `copy_`. Now put
    replaces the value and never looks a method up on it: the hook never runs, the candidate has
    no answer, and its zeros are INCORRECT (deterministic: no timing involved)."""
    task = find_task("example-matmul")
    small = {"m": 48, "k": 48, "n": 48}
    patch = make_patch(task, "projection.py", ARENA_HOOK)
    result = run_experiment(task, patch, sandbox=backend, params=small).result
    assert result.verdict == Verdict.INCORRECT, result.render()
    assert result.evidence.stage_reached == "correctness"


# -- worker-level: every other way candidate code could run outside its call -----------------

CANDIDATE = """
import gc
import signal
import sys
import weakref

import torch


_open = open


def _mark(name):
    with _open(name, "w") as f:
        f.write("ran")


class Dying:
    def __del__(self):
        _mark("del_ran")


def attach(x):
    # instance methods the worker might look up, and objects freed when the worker drops x
    x.copy_ = lambda value: _mark("copy_ran")
    x.detach = lambda: _mark("detach_ran")
    x.payload = Dying()
    weakref.finalize(x, _mark, "finalizer_ran")
    return 1


def noop(x=None):
    return 1


class Items(list):
    def __iter__(self):
        _mark("iter_ran")
        return super().__iter__()


class Ratio(float):
    def __repr__(self):
        _mark("repr_ran")
        return "0.0"


def tricky_result():
    out = torch.ones(3)
    out.detach = lambda: _mark("detach_ran")
    return {"items": Items([1.0, 2.0]), "ratio": Ratio(2.5), "tensor": out}


def signal_handler():
    signal.signal(signal.SIGALRM, lambda *a: _mark("signal_ran"))
    return 1


def gc_callback():
    gc.callbacks.append(lambda *a: _mark("gc_ran"))
    return 1


def audit_hook():
    try:
        sys.addaudithook(lambda *a: None)
    except PermissionError:
        pass
    return 1


def torch_mode():
    torch.overrides.TorchFunctionMode().__enter__()
    return 1


def patch_reshape():
    torch.Tensor.reshape = lambda *a, **k: _mark("reshape_ran")
    torch.frombuffer = lambda *a, **k: _mark("frombuffer_ran")
    return 1


def _spy_on(owners, names=None):
    # Each function of `owners` (all public ones, or `names`) becomes a spy that leaves a mark
    # when code other than this file calls it.
    import types

    here = sys._getframe().f_code.co_filename
    kinds = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
             types.WrapperDescriptorType, types.BuiltinMethodType)

    def spy(name, real):
        def wrapper(*a, **k):
            if sys._getframe(1).f_code.co_filename != here:
                _mark(name + "_ran")  # what ran() looks for
            return real(*a, **k)
        return wrapper

    for owner in owners:
        label = getattr(owner, "__name__", "?")
        for name in names or [n for n in dir(owner) if not n.startswith("_")]:
            value = getattr(owner, name, None)
            if type(value) in kinds:
                try:
                    setattr(owner, name, spy(f"{label}.{name}", value))
                except (AttributeError, TypeError):
                    pass  # read-only (a C type's slot)


def patch_stdlib():
    # Every function of builtins and of the stdlib modules the worker's bookkeeping could reach
    # (the timer cheat measured 1.14x once in docker): the worker must reach none of them.
    import builtins
    import ctypes
    import enum
    import importlib
    import json
    import operator
    import os
    import struct
    import threading
    import time
    import traceback

    _spy_on((builtins, ctypes, enum, gc, importlib, json, operator, os, os.path, signal, struct,
             sys, threading, time, traceback))
    return 1


def patch_torch_everywhere():
    # Every public function of torch, torch.nn.functional and torch.Tensor (about 1,900), and
    # the dunders a reader of tensors might dispatch on.
    dunders = ["__getitem__", "__len__", "__iter__", "__eq__", "__bool__", "__index__",
               "__float__", "__int__", "__repr__", "__format__", "__array__", "__reduce_ex__",
               "__deepcopy__", "__contiguous__"]
    _spy_on((torch, torch.nn.functional, torch.Tensor))
    _spy_on((torch.Tensor,), [d for d in dunders if hasattr(torch.Tensor, d)])
    return 1


def late_binder():
    import socket
    import threading

    def later():
        with _open("go") as fifo:  # blocks until the test writes, after the call returned
            fifo.read()
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind("late.sock")
            _mark("bound_ran")
        except PermissionError:
            _mark("denied_ran")

    threading.Thread(target=later, daemon=True).start()
    return 1


def import_own(name):
    import importlib

    importlib.import_module(name)
    return 1


def give(x):
    return {"t": x * 2, "items": [x.sum().item()], "view": x[0:2]}


_LIBRARY = []


def override_view():
    # torch.library replaces aten::view's CPU kernel for the whole process: any reshape, the
    # worker's own when it builds a put's tensor included, would run this function
    import warnings

    warnings.simplefilter("ignore")
    lib = torch.library.Library("aten", "IMPL")

    def view(self, size):
        _mark("view")
        strides = torch._prims_common.make_contiguous_strides_for(size)
        return torch.ops.aten.alias.default(self).as_strided(size, strides)

    lib.impl("view", view, "CPU")
    _LIBRARY.append(lib)
    return 1


def write_into(xs):
    xs[0] = 0.0
    return xs
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "cand.py").write_text(CANDIDATE)
    with create_sandbox("local", ws, SandboxSpec()) as sb:
        yield sb


@pytest.fixture
def worker(sandbox: Sandbox) -> Iterator[RpcWorker]:
    root = str(sandbox.root)
    w = RpcWorker(sandbox, call_timeout_s=30, preload=["torch"], guard={"writable": [root]})
    yield w
    w.close()
    for marker in Path(root).glob("*_ran"):
        marker.unlink()


def ran(sandbox: Sandbox) -> set[str]:
    return {p.name.removesuffix("_ran") for p in sandbox.root.glob("*_ran")}


def test_put_never_runs_what_the_candidate_attached(worker: RpcWorker, sandbox: Sandbox) -> None:
    worker.put("x", torch.zeros(3))
    assert worker.call("cand:attach", ref("x")) == 1
    worker.put("x", torch.ones(3))  # replaces the tensor the candidate decorated
    assert ran(sandbox) == set(), "candidate code ran during a put"
    assert worker.call("cand:noop") == 1  # the replaced tensor is freed inside this call
    assert ran(sandbox) == {"del", "finalizer"}


def test_results_are_read_without_their_own_methods(worker: RpcWorker, sandbox: Sandbox) -> None:
    result = worker.call("cand:tricky_result")
    assert result["items"] == [1.0, 2.0] and result["ratio"] == 2.5
    assert torch.equal(result["tensor"], torch.ones(3))
    assert ran(sandbox) == set()


@pytest.mark.parametrize(
    ("function", "left"),
    [
        ("signal_handler", "a handler for signal"),
        ("gc_callback", "a garbage-collector callback"),
        ("torch_mode", "a torch function mode"),
        ("audit_hook", "sys.addaudithook"),
    ],
)
def test_hooks_that_would_run_code_later_are_violations(
    worker: RpcWorker, sandbox: Sandbox, function: str, left: str
) -> None:
    with pytest.raises(CandidateFailure, match=left) as info:
        worker.call(f"cand:{function}")
    assert info.value.kind == "violation"
    assert ran(sandbox) == set()


def test_patched_torch_does_not_reach_the_worker(worker: RpcWorker, sandbox: Sandbox) -> None:
    """The worker builds and reads tensors through torch's C entry points captured at preload."""
    assert worker.call("cand:patch_reshape") == 1
    worker.put("x", torch.arange(6.0).reshape(2, 3))
    assert worker.call("cand:noop", ref("x")) == 1
    assert worker.call("cand:noop", torch.ones(2)) == 1
    assert ran(sandbox) == set()
    assert worker.call("cand:patch_torch_everywhere") == 1
    worker.put("x", torch.arange(6.0).reshape(2, 3))
    assert worker.call("cand:give", ref("x"))["items"] == [15.0]
    assert worker.call("cand:noop", [torch.ones(2, dtype=torch.float16), torch.zeros(2)]) == 1
    assert ran(sandbox) == set()


def test_patched_stdlib_does_not_reach_the_worker(worker: RpcWorker, sandbox: Sandbox) -> None:
    """The worker's bookkeeping (decoding, snapshots, encoding, self-report, the guard) uses
    functions captured before candidate code ran and a private copy of builtins, so a candidate
    cannot change what that bookkeeping costs, nor run code during it."""
    assert worker.call("cand:patch_stdlib") == 1
    worker.put("x", torch.arange(4.0))
    assert worker.call("cand:noop", ref("x")) == 1
    assert worker.call("cand:noop", [1.0, {"k": (2, "s")}]) == 1
    assert ran(sandbox) == set()


def test_candidate_code_running_during_a_put_is_a_violation(
    worker: RpcWorker, sandbox: Sandbox
) -> None:
    """The backstop behind every other rule: once candidate code may exist, a put runs under a
    profiler, and any frame of workspace code there is a violation. An aten kernel the candidate
    replaced runs inside the worker's own reshape (deterministic: the kernel is called)."""
    assert worker.call("cand:override_view") == 1
    with pytest.raises(
        CandidateFailure, match=r"running code outside its call \(cand.py:view"
    ) as info:
        worker.put("x", torch.arange(6.0).reshape(2, 3))
    assert info.value.kind == "violation"


def test_the_guard_holds_between_calls(sandbox: Sandbox) -> None:
    """A thread the task lets live between calls (allow=['background']) is guarded there too:
    it waits on a FIFO the test writes only after the call returned, then binds a socket, which
    the task's rules deny; the next request reports the violation (event-driven, no timing)."""
    root = sandbox.root
    os.mkfifo(root / "go")
    guard = {"writable": [str(root)], "deny": ["network"]}
    w = RpcWorker(sandbox, call_timeout_s=30, preload=["torch"], guard=guard, background=True)
    try:
        assert w.call("cand:late_binder") == 1
        (root / "go").write_text("go")  # opens when the thread reads: the call has returned
        deadline = time.monotonic() + 60
        while not ran(sandbox) and time.monotonic() < deadline:  # until the thread's mark
            time.sleep(0.05)
        assert ran(sandbox) == {"denied"}
        with pytest.raises(CandidateFailure, match="socket.bind") as info:
            w.call("cand:noop")
        assert info.value.kind == "violation"
    finally:
        w.close()
        (root / "go").unlink()
        for marker in root.glob("*_ran"):
            marker.unlink()


@pytest.mark.parametrize("name", ["_infra_rpc_worker", "_infra_rpc_codec", "_infra_rpc_guard"])
def test_the_worker_and_its_codec_cannot_be_imported(worker: RpcWorker, name: str) -> None:
    """Both files lie in the workspace, which is on the candidate's path: a fresh copy of either
    would hand the candidate the worker's code to study or to drive; both are refused."""
    with pytest.raises(CandidateFailure, match=f"importing {name}") as info:
        worker.call("cand:import_own", name)
    assert info.value.kind == "violation"


def test_changing_an_input_is_incorrect(worker: RpcWorker) -> None:
    with pytest.raises(IncorrectOutput, match="argument 1 .a list's items were replaced"):
        worker.call("cand:write_into", [1.0, 2.0])


def test_inplace_tasks_may_change_their_inputs(sandbox: Sandbox) -> None:
    w = RpcWorker(sandbox, call_timeout_s=30, preload=["torch"], inplace=True)
    try:
        assert w.call("cand:write_into", [1.0, 2.0]) == [0.0, 2.0]
    finally:
        w.close()
