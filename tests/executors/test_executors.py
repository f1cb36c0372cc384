"""Executors: local and Ray give the same verdicts on a bundled CPU task; faults become FAILED
records with their cause (a hang past the timeout, a worker killed mid-batch is retried once)."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from pathlib import Path

import pytest
from support import ExperimentGate

from infra_agent.experiments.executors import (
    ExperimentRequest,
    create_executor,
    run_batch,
)
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.patch import load_patch, parse_diff
from infra_agent.tasks.registry import find_task

TASK = "example-matmul"


def _requests() -> list[ExperimentRequest]:
    task = find_task(TASK)
    assert task.reference_patch is not None
    reference = load_patch(task.reference_patch)
    return [
        ExperimentRequest(id="reference", task=TASK, patch=reference, seed=1),
        ExperimentRequest(id="reference-again", task=TASK, patch=reference, seed=2),
    ]


def _judged(result) -> bool:  # type: ignore[no-untyped-def]
    """The executor carried the whole cascade: the patch applied, passed its checks and was
    timed to a verdict on the metric. Which side of noise the honest speedup lands on is the
    statistics' business (tests/experiments), not the executor's: beside a loaded sibling
    worker a suite run read the reference NO_CHANGE once."""
    return (
        result.verdict in (Verdict.IMPROVED, Verdict.NO_CHANGE)
        and result.evidence.correctness is not None
        and result.evidence.correctness.passed
    )


def _hang_request(timeout_s: float) -> ExperimentRequest:
    """A candidate that never returns: the executor's timeout (not the task's) must end it."""
    task = find_task(TASK)
    first = (task.workspace / "projection.py").read_text().splitlines()[:3]
    diff = (
        "--- a/projection.py\n+++ b/projection.py\n@@ -1,3 +1,4 @@\n+while True: pass\n"
        + "".join(f" {line}\n" for line in first)
    )
    return ExperimentRequest(id="hang", task=TASK, patch=parse_diff(diff), timeout_s=timeout_s)


def test_local_executor_verdicts_and_timeout() -> None:
    executor = create_executor("local", parallel=1)
    outcomes = run_batch(executor, [_requests()[0], _hang_request(timeout_s=8)])
    by_id = {o.request_id: o for o in outcomes}
    assert _judged(by_id["reference"].record.result)
    hang = by_id["hang"].record.result
    assert hang.verdict == Verdict.FAILED
    assert hang.verdict != Verdict.IMPROVED
    assert by_id["reference"].record.result.evidence.extra["node"]
    assert 0 <= by_id["reference"].overhead_s < by_id["reference"].wall_s


def test_local_executor_parallel_uses_disjoint_cpu_sets() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    executor = create_executor("local", parallel=2)
    outcomes = run_batch(executor, _requests())
    cpu_sets = [tuple(o.record.result.evidence.extra["cpus"]) for o in outcomes]  # type: ignore[arg-type]
    assert len(set(cpu_sets)) == 2 and not set(cpu_sets[0]) & set(cpu_sets[1])
    assert all(_judged(o.record.result) for o in outcomes)


def test_unknown_executor_is_a_clear_error() -> None:
    from infra_agent.errors import UserError

    with pytest.raises(UserError, match="unknown executor 'slurm'"):
        create_executor("slurm")


@pytest.fixture(scope="module")
def ray_executor(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    pytest.importorskip("ray")
    temp = Path(tmp_path_factory.mktemp("ray"))
    executor = create_executor("ray", num_cpus=2, temp_dir=temp)
    yield executor
    executor.shutdown()


def test_ray_executor_matches_local_verdicts(ray_executor) -> None:  # type: ignore[no-untyped-def]
    outcomes = run_batch(ray_executor, [_requests()[0], _hang_request(timeout_s=25)])
    by_id = {o.request_id: o for o in outcomes}
    assert _judged(by_id["reference"].record.result)
    assert by_id["hang"].record.result.verdict == Verdict.FAILED
    assert "timed out" in by_id["hang"].record.result.reasons[0]
    # Baseline and candidate are arms of one task, so one node ran both.
    assert by_id["reference"].node == by_id["reference"].record.result.evidence.extra["node"]


def test_ray_executor_survives_a_worker_killed_mid_batch(ray_executor, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # A copy of the task whose first experiment waits at a gate: the worker is killed while that
    # experiment is certainly in progress; the retry passes the open gate.
    task = tmp_path / TASK
    shutil.copytree(find_task(TASK).root, task)
    gate = ExperimentGate(task, tmp_path / "gate")
    [request] = [r.model_copy(update={"task": str(task)}) for r in _requests()[:1]]
    killed: list[int] = []

    def kill_the_held_worker() -> None:
        pid = gate.wait_held()
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        gate.release()

    killer = threading.Thread(target=kill_the_held_worker, daemon=True)
    killer.start()
    outcomes = run_batch(ray_executor, [request])
    killer.join(timeout=60)
    assert killed, "the test never found the worker to kill"
    by_id = {o.request_id: o for o in outcomes}
    retried = by_id["reference"]
    assert retried.attempts == 2 and gate.started == 2
    assert _judged(retried.record.result)  # the retry ran the real experiment
