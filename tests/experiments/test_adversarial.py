"""Cheating candidates: each must come out INCORRECT or REJECTED (never IMPROVED); hangs and
runaway allocation must end FAILED within the task's timeout, and the next experiment must run.

Each cheat is written so that it would win if its defence were missing (an in-process harness,
timing in the candidate's process, inputs reused between warm-up and timing, no float64 rule).
Static rules are the first line; `no_static_rules` turns them off to test the run-time defence
behind each one (audit hook, /proc watch, safe responses, sandbox, fresh inputs), over both
sandbox backends where this machine can run them.
"""

from __future__ import annotations

import difflib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from infra_agent.experiments import run_experiment
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.patch import Patch, parse_diff
from infra_agent.tasks.registry import find_task

FAST = """
def axpy(a, xs, ys):
    return [a * x + y for x, y in zip(xs, ys)]
"""

THREAD_HANDOFF = """
import threading
import time


def axpy(a, xs, ys):
    out = [0.0] * len(xs)

    def work():
        time.sleep(0.05)
        for i in range(len(xs)):
            out[i] = a * xs[i] + ys[i]

    threading.Thread(target=work).start()
    return out  # filled in later: an in-process harness would see it complete
"""

THREAD_HANDOFF_INDIRECT = THREAD_HANDOFF.replace("import threading\n", "import queue\n").replace(
    "threading.Thread(target=work)",  # threading, reached through queue's attribute
    'getattr(queue.threading, "Thread")(target=work)',
)

CHILD_PROCESS = """
import subprocess
import sys


def axpy(a, xs, ys):
    # off-the-clock helper left running after the call returns
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    return [a * x + y for x, y in zip(xs, ys)]
"""

NETWORK = """
import socket


def axpy(a, xs, ys):
    with socket.create_connection(("127.0.0.1", {port}), timeout=2) as s:
        s.sendall(b"leak")
    return [a * x + y for x, y in zip(xs, ys)]
"""

WRITE_OUTSIDE = """
def axpy(a, xs, ys):
    with open({path!r}, "w") as f:
        f.write("escaped")
    return [a * x + y for x, y in zip(xs, ys)]
"""

READ_HARNESS = """
_SEEN = []


def axpy(a, xs, ys):
    with open({path!r}) as f:
        _SEEN.append(f.read())  # the grader's code: reference, seeds, tolerances
    return [a * x + y for x, y in zip(xs, ys)]
"""

SLOW_BODY = """
def axpy(a, xs, ys):
    out = []
    for i in range(len(xs)):
        y = ys[0]
        for j in range(i + 1):
            y = ys[j]
        out.append(a * xs[i] + y)
    return out
"""

PATCH_TIMERS = (
    """
import time

time.perf_counter = lambda: 0.0
time.perf_counter_ns = lambda: 0
time.time = lambda: 0.0
"""
    + SLOW_BODY
)

PATCH_HARNESS = """
def _always_fast(self, arm, seed):
    return {"latency_ms": 1e-6}


try:
    from infra_agent.tasks import harness as _harness

    _harness.Harness.sample = _always_fast
except ImportError:
    pass


def axpy(a, xs, ys):
    return [a * x + y for x, y in zip(xs, ys)]
"""

CONTENT_CACHE = (
    SLOW_BODY.replace("def axpy", "def _slow")
    + """
_CACHE = {}


def axpy(a, xs, ys):
    key = hash((a, tuple(xs), tuple(ys)))
    if key not in _CACHE:
        _CACHE[key] = _slow(a, xs, ys)
    return _CACHE[key]
"""
)

IDENTITY_CACHE_PY = (
    SLOW_BODY.replace("def axpy", "def _slow")
    + """
_CACHE = {}


def axpy(a, xs, ys):
    key = (id(xs), id(ys))
    if key not in _CACHE:
        _CACHE[key] = _slow(a, xs, ys)
    return _CACHE[key]
"""
)

SLEEP_FOREVER = """
import time


def axpy(a, xs, ys):
    if len(xs) > 0:
        time.sleep(10**6)
    return []
"""

ALLOCATE_FOREVER = """
def axpy(a, xs, ys):
    hoard = []
    while True:
        hoard.append(bytes(256 * 1024 * 1024))  # calloc'd: address space grows at once
"""


def patch_for(task, relpath: str, new_text: str) -> Patch:
    old = (task.workspace / relpath).read_text().splitlines(keepends=True)
    new = new_text.splitlines(keepends=True)
    return parse_diff("".join(difflib.unified_diff(old, new, f"a/{relpath}", f"b/{relpath}")))


def run(task, source: str, backend: str = "local"):  # -> ExperimentResult
    return run_experiment(task, patch_for(task, "kernel.py", source), sandbox=backend).result


AA_IMPROVED = 0.032
"""At most this often one experiment on a candidate doing the baseline's work is IMPROVED:
benchmarks/bench_verdict_margins.py pytask-timers and pytask-content-cache (the experiments of
the tests below) found NO_CHANGE every time, their log speedups 3.4 and 1.8 sd inside the 1.05x
that IMPROVED needs first (normal tails 3.3e-4 and 3.2e-2)."""


def unless_improved_thrice(experiment: Callable[[], Any]) -> Iterator[Any]:
    """Results of `experiment` on a candidate that does the baseline's work: another one only
    after an IMPROVED one, three at most. All three IMPROVED, the only way such a test fails
    falsely, happens with at most AA_IMPROVED cubed (3.3e-5) per run; a real gain is IMPROVED
    every time."""
    for _ in range(3):
        result = experiment()
        yield result
        if result.verdict != Verdict.IMPROVED:
            return


def assert_caught(result, *verdicts: Verdict) -> None:
    allowed = verdicts or (Verdict.INCORRECT, Verdict.REJECTED)
    assert result.verdict in allowed, result.render()
    assert result.verdict != Verdict.IMPROVED


# -- static rules: the cheapest line, no sandbox started -------------------------------------


@pytest.mark.parametrize(
    ("source", "group"),
    [
        (THREAD_HANDOFF, "threads"),
        (THREAD_HANDOFF_INDIRECT, "threads"),
        (CHILD_PROCESS, "processes"),
        (NETWORK.format(port=9), "network"),
        (WRITE_OUTSIDE.format(path="/tmp/escaped.txt"), "harness"),
        (READ_HARNESS.format(path="../harness.py"), "harness"),
        (PATCH_TIMERS, "timers"),
        (PATCH_HARNESS, "harness"),
        (CONTENT_CACHE, "state"),
        (IDENTITY_CACHE_PY, "state"),
    ],
    ids=[
        "thread",
        "thread-indirect",
        "child",
        "network",
        "write",
        "read-harness",
        "timers",
        "patch-harness",
        "content-cache",
        "identity-cache",
    ],  # fmt: skip
)
def test_static_rules_reject_cheats(pytask, source: str, group: str) -> None:
    result = run(pytask(), source)
    assert_caught(result, Verdict.REJECTED)
    assert any(f"rule '{group}'" in r for r in result.reasons), result.reasons
    assert result.evidence.stage_reached == "static"


# -- run-time defences (static rules off, or the group allowed) ------------------------------


def test_background_thread_is_caught(pytask, backend: str) -> None:
    """With `threads` allowed by the task, the cheat passes the static stage and is judged at
    run time instead."""
    # Not a bet on timing: the handed-off thread sleeps 50 ms before it works, so the watch finds
    # it alive when the first warm-up call returns. Missing it needs the harness to look more
    # than 50 ms late after each of the 2 warm-up calls and the first check alike (then the
    # check sees the zeros, INCORRECT without "thread"): well under 1 in a million runs even if
    # a loaded machine delayed one look in a hundred that long.
    result = run(pytask(allow=["threads"]), THREAD_HANDOFF, backend)
    assert result.evidence.stage_reached != "static"
    assert_caught(result)
    assert "thread" in " ".join(result.reasons)


def test_thread_reached_indirectly_is_caught_at_run_time(
    pytask, backend: str, no_static_rules: None
) -> None:
    """Behind the static rules, the process watch sees the thread however the code reached
    threading (deterministic: the thread is alive, asleep, when the call returns)."""
    result = run(pytask(), THREAD_HANDOFF_INDIRECT, backend)
    assert_caught(result, Verdict.REJECTED)
    assert "thread(s) running" in " ".join(result.reasons)


def test_child_process_left_running_is_caught(pytask, backend: str, no_static_rules: None) -> None:
    allowed = run(pytask(allow=["processes"]), CHILD_PROCESS, backend)
    assert_caught(allowed, Verdict.REJECTED)
    assert "child process" in " ".join(allowed.reasons)
    denied = run(pytask(), CHILD_PROCESS, backend)  # the audit hook refuses the spawn itself
    assert_caught(denied, Verdict.REJECTED)
    assert "subprocess.Popen" in " ".join(denied.reasons)


def test_network_is_refused_and_nothing_leaks(pytask, backend: str, no_static_rules: None) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    received: list[bytes] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                received.append(conn.recv(16))
                conn.close()
            except OSError:
                continue

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    try:
        port = server.getsockname()[1]
        denied = run(pytask(), NETWORK.format(port=port), backend)
        assert_caught(denied, Verdict.REJECTED)
        assert "socket.connect" in " ".join(denied.reasons)
        # Allowed by the task: the sandbox has no network, so the connection fails.
        allowed = run(pytask(allow=["network"]), NETWORK.format(port=port), backend)
        assert allowed.verdict == Verdict.FAILED, allowed.render()
    finally:
        stop.set()
        listener.join(timeout=5)
        server.close()
    assert received == []


def test_writing_outside_the_workspace_is_refused(
    pytask, backend: str, no_static_rules: None
) -> None:
    task = pytask()
    target = task.root / "harness_override.py"  # next to the harness: the real prize
    result = run(task, WRITE_OUTSIDE.format(path=str(target)), backend)
    assert_caught(result, Verdict.REJECTED)
    assert "the harness or the package" in " ".join(result.reasons)
    assert not target.exists()


def test_reading_the_harness_is_refused(pytask, backend: str, no_static_rules: None) -> None:
    task = pytask()
    result = run(task, READ_HARNESS.format(path=str(task.harness_path)), backend)
    assert_caught(result)
    assert result.verdict != Verdict.NO_CHANGE


def test_patched_timers_do_not_change_the_harness_clock(
    pytask, backend: str, no_static_rules: None
) -> None:
    """The clock is in the harness process: a candidate's patched time module cannot stop it."""
    for result in unless_improved_thrice(lambda: run(pytask(), PATCH_TIMERS, backend)):
        perf = result.evidence.performance  # a stopped clock would read ~0 for the candidate
        assert perf is not None and perf.candidate_median > 0.2 * perf.baseline_median
    assert result.verdict in (Verdict.NO_CHANGE, Verdict.REGRESSED), result.render()


def test_patching_the_harness_is_refused(pytask, backend: str, no_static_rules: None) -> None:
    result = run(pytask(), PATCH_HARNESS, backend)
    assert_caught(result, Verdict.REJECTED)
    assert "importing infra_agent" in " ".join(result.reasons)


def test_content_hash_cache_never_sees_a_repeated_input(pytask) -> None:
    """With `state` allowed by the task, the cache passes the static stage; every timed call
    still gets fresh inputs, so a cache keyed on content never hits: the cheat buys nothing."""
    for result in unless_improved_thrice(lambda: run(pytask(allow=["state"]), CONTENT_CACHE)):
        assert result.evidence.stage_reached != "static"
    assert result.verdict in (Verdict.NO_CHANGE, Verdict.REGRESSED), result.render()


def test_hang_and_runaway_allocation_fail_and_the_next_experiment_runs(
    pytask, backend: str
) -> None:
    task = pytask()
    hung = run(task, SLEEP_FOREVER, backend)
    assert hung.verdict == Verdict.FAILED, hung.render()
    # Ended by the call's own limit (5 s), not by the experiment's (60 s): the reason names it.
    budget = task.manifest.budget
    assert f"did not return within {budget.call_timeout_s:g} s" in " ".join(hung.reasons)
    assert hung.evidence.durations_s["prepare"] < budget.experiment_timeout_s
    hog = run(task, ALLOCATE_FOREVER, backend)
    assert hog.verdict == Verdict.FAILED, hog.render()
    assert "memory" in " ".join(hog.reasons).lower() or "timed out" in " ".join(hog.reasons)
    honest = run(task, FAST, backend)  # the sandbox machinery is still usable: checked, timed
    assert honest.verdict in (Verdict.IMPROVED, Verdict.NO_CHANGE), honest.render()
    assert honest.evidence.correctness is not None and honest.evidence.correctness.passed
    assert honest.evidence.performance is not None and honest.evidence.performance.n_samples > 0


# -- tensor cheats on the bundled example task ------------------------------------------------

ZEROS = '''"""A projection layer's matrix product."""

import torch


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.zeros(x.shape[0], w.shape[1])
'''

IDENTITY_CACHE = '''"""A projection layer's matrix product, remembered per input object."""

import torch

_CACHE = {}


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    key = (id(x), id(w))
    if key not in _CACHE:
        _CACHE[key] = x @ w
    return _CACHE[key]
'''


SMALL = {"m": 48, "k": 48, "n": 48}
"""Inputs for the tensor cheats: what they show does not depend on size, only worker start does."""


@pytest.mark.slow
def test_all_zero_output_passes_loose_atol_but_not_the_float64_rule(backend: str) -> None:
    task = find_task("example-matmul")
    patch = patch_for(task, "projection.py", ZEROS)
    result = run_experiment(task, patch, sandbox=backend, params=SMALL).result
    assert_caught(result, Verdict.INCORRECT)
    corr = result.evidence.correctness
    assert corr is not None and corr.max_abs_err is not None
    assert corr.max_abs_err < 1e-2  # a loose absolute tolerance alone would have passed it
    assert "float64" in " ".join(result.reasons)
    assert result.evidence.sandbox is not None and result.evidence.sandbox.backend == backend


def test_identity_cache_is_rejected_by_the_state_rule() -> None:
    task = find_task("example-matmul")
    result = run_experiment(task, patch_for(task, "projection.py", IDENTITY_CACHE)).result
    assert_caught(result, Verdict.REJECTED)
    assert any("rule 'state'" in r for r in result.reasons), result.reasons


IDENTITY_CACHE_SLOW_MISS = '''"""A projection remembered per input object; a miss costs 5 ms more than baseline."""

import time

import torch

_CACHE = {}


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    key = (id(x), id(w))
    if key not in _CACHE:
        time.sleep(0.005)
        _CACHE[key] = (x.unsqueeze(2) * w.unsqueeze(0)).sum(dim=1)
    return _CACHE[key]
'''


@pytest.mark.slow
def test_cache_keyed_on_input_identity_never_answers_a_new_input(
    backend: str, no_static_rules: None
) -> None:
    """Behind the state rule: every put is a fresh object, so an identity cache either misses
    (and the candidate pays its 5 ms: REGRESSED) or answers a new input with an old output
    (INCORRECT); only a hit on the same content, the hole, could make it IMPROVED.
    False-failure probability per run: below 1e-6 (every miss costs 5 ms against baseline's
    ~0.1 ms call: each of the >= 10 pairs is slower, far outside any noise)."""
    task = find_task("example-matmul")
    patch = patch_for(task, "projection.py", IDENTITY_CACHE_SLOW_MISS)
    result = run_experiment(task, patch, sandbox=backend, params=SMALL).result
    assert_caught(result, Verdict.INCORRECT, Verdict.REGRESSED)
