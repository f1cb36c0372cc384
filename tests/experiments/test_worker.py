"""The RPC worker: safe responses, protected protocol, timeouts, run-time rules."""

from __future__ import annotations

import pickle

import pytest
import torch

from infra_agent.experiments.worker import RpcWorker, _load_response, ref
from infra_agent.sandboxes import SandboxSpec, create_sandbox
from infra_agent.tasks.harness import CandidateFailure, IncorrectOutput

CODE = """
import os

import torch


def echo(*args, **kwargs):
    print("candidate output that must not reach the protocol")
    os.write(1, b"raw bytes on fd 1")
    return {"args": args, "kwargs": kwargs}


def tensors(x):
    return (x * 2, [x.to(torch.float64)[:2], torch.arange(3)], {"n": 1.5, "ok": True, "none": None})


def bump(x):
    x.add_(1)
    return x


def double(x):
    return x * 2


def append(items):
    items[0] = 7
    return items


class Sneaky:
    def __reduce__(self):
        return (os.system, ("true",))


def sneaky():
    return Sneaky()


def crash():
    raise ValueError("boom")
"""

PLAIN = """
import threading
import time


def slow():
    time.sleep(60)


def pool():
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    return 1


def ok():
    return 1
"""


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory):  # -> Iterator[Sandbox]
    ws = tmp_path_factory.mktemp("ws")
    (ws / "cand.py").write_text(CODE)
    (ws / "plain.py").write_text(PLAIN)
    with create_sandbox("local", ws, SandboxSpec()) as sb:
        yield sb


@pytest.fixture(scope="module")
def worker(sandbox):  # -> Iterator[RpcWorker]: one torch worker shared by the gentle tests
    w = RpcWorker(sandbox, call_timeout_s=30, preload=["torch"])
    yield w
    w.close()


@pytest.fixture
def plain_worker(sandbox):  # -> Iterator[RpcWorker]: no torch, starts fast, may be killed
    w = RpcWorker(sandbox, call_timeout_s=30)
    yield w
    w.close()


def test_round_trip_values_and_prints_do_not_corrupt(worker: RpcWorker) -> None:
    assert worker.call("cand:echo", 1, "s", k=[1, 2]) == {"args": (1, "s"), "kwargs": {"k": [1, 2]}}
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    doubled, (as64, ar), meta = worker.call("cand:tensors", x)
    assert (
        torch.equal(doubled, x * 2)
        and as64.dtype == torch.float64
        and torch.equal(ar, torch.arange(3))
    )
    assert meta == {"n": 1.5, "ok": True, "none": None}
    value, seconds = worker.timed_call("cand:echo")
    assert seconds > 0


def test_arena_values_are_replaced_and_inputs_may_not_change(worker: RpcWorker) -> None:
    worker.put("x", torch.zeros(3))
    assert worker.call("cand:double", ref("x")).tolist() == [0, 0, 0]
    worker.put("x", torch.full((3,), 5.0))
    assert worker.call("cand:double", ref("x")).tolist() == [10, 10, 10]
    with pytest.raises(IncorrectOutput, match="argument 1 .a tensor's contents were written"):
        worker.call("cand:bump", ref("x"))
    with pytest.raises(IncorrectOutput, match="argument 1 .a list's items were replaced"):
        worker.call("cand:append", [1, 2])


def test_objects_that_would_unpickle_into_code_cannot_be_returned(worker: RpcWorker) -> None:
    with pytest.raises(CandidateFailure, match="cannot return a Sneaky") as info:
        worker.call("cand:sneaky")
    assert info.value.kind == "protocol"


def test_the_safe_loader_refuses_pickles() -> None:
    payload = pickle.dumps({"ok": True})  # the worker never sends pickles, nor reads them
    with pytest.raises(ValueError):
        _load_response(payload)
    with pytest.raises(ValueError):
        _load_response(b"R" + (2).to_bytes(8, "big") + b"[]")


def test_a_crash_is_reported_and_the_worker_lives_on(worker: RpcWorker) -> None:
    with pytest.raises(CandidateFailure, match="ValueError: boom") as info:
        worker.call("cand:crash")
    assert info.value.kind == "crash" and "boom" in info.value.log_tail
    assert worker.call("cand:echo") == {"args": (), "kwargs": {}}


def test_thread_left_running_after_a_call_is_a_violation(plain_worker: RpcWorker) -> None:
    plain_worker.call("plain:ok")
    with pytest.raises(CandidateFailure, match="thread") as info:
        plain_worker.call("plain:pool")
    assert info.value.kind == "violation"


def test_timeout_kills_the_worker(plain_worker: RpcWorker) -> None:
    with pytest.raises(CandidateFailure, match="did not return within 1 s") as info:
        plain_worker.call("plain:slow", timeout_s=1)
    assert info.value.kind == "timeout"
    with pytest.raises(CandidateFailure, match="not running"):
        plain_worker.call("plain:ok")
