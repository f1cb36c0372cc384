"""The executor interface between the agent and experiments: submit, collect, cancel, list.

An executor takes `ExperimentRequest`s and returns `ExecutionOutcome`s. Whatever goes wrong on
the way (a worker that dies, an experiment that hangs past its timeout, a lost node) becomes a
`FAILED` experiment with the cause in its reasons: it never stalls or kills the caller's run.
Only the driver (the caller) writes the run store; executors return typed records.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from typing import Protocol

from pydantic import BaseModel, Field

from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import ExperimentResult, Verdict
from infra_agent.tasks.patch import DEFAULT_MAX_PATCH_BYTES, Patch


class Resources(BaseModel):
    """What one experiment needs while it runs."""

    cpus: int = 1
    """CPU cores reserved for the experiment (both arms run inside it, one after the other)."""
    gpus: int = 0
    """Whole GPUs; two experiments never share one."""
    exclusive_node: bool = False
    """Take a whole node (serving targets: server, load generator and measurement together)."""


class ExperimentRequest(BaseModel):
    """One experiment to run: a task, a patch, where and with what."""

    id: str
    """Caller's handle for the request (unique within a batch)."""
    task: str
    """Task name or folder path, resolved on the worker."""
    patch: Patch
    sandbox: str = "local"
    params: dict[str, object] = Field(default_factory=dict)
    seed: int | None = None
    run_id: str | None = None
    resources: Resources = Field(default_factory=Resources)
    timeout_s: float = 900.0
    """Wall-clock limit for the whole experiment, queueing excluded."""
    extend: ExperimentRecord | None = None
    """An unresolved NO_CHANGE of the same patch this experiment continues (experiments.extend)."""
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES
    """The configured `sandbox.max_patch_bytes`: a larger diff is REJECTED."""


class ExecutionOutcome(BaseModel):
    """What came back for a request: always a record (FAILED with the cause if nothing else)."""

    request_id: str
    record: ExperimentRecord
    node: str = ""
    """Host that ran it (baseline and candidate always run there together)."""
    attempts: int = 1
    """How many times it was started (a dead worker is retried once)."""
    wall_s: float = 0.0
    """Submit-to-result seconds as the driver saw them."""
    overhead_s: float = 0.0
    """Wall time not spent inside the experiment itself (process or task start-up, imports,
    transfer). Local: counted from the experiment's process start. Ray does not report start
    times, so there it is counted from submission and includes time queued behind others."""


class Executor(Protocol):
    name: str

    def submit(self, request: ExperimentRequest) -> str:
        """Queue a request; returns its id."""
        ...

    def collect(self, timeout_s: float | None = None) -> list[ExecutionOutcome]:
        """Wait for every submitted request (or until `timeout_s`) and return outcomes so far."""
        ...

    def cancel(self, request_id: str) -> bool:
        """Cancel a queued or running request (it comes back FAILED). False if already done."""
        ...

    def running(self) -> list[str]:
        """Ids of requests submitted and not yet collected."""
        ...

    def shutdown(self) -> None:
        """Cancel everything outstanding and release resources."""
        ...


def run_batch(executor: Executor, requests: Iterable[ExperimentRequest]) -> list[ExecutionOutcome]:
    """Submit all requests, collect all outcomes, return them in request order.

    Ctrl-C cancels every outstanding experiment before re-raising."""
    ids = [executor.submit(r) for r in requests]
    try:
        outcomes = {o.request_id: o for o in executor.collect()}
    except KeyboardInterrupt:
        for request_id in executor.running():
            executor.cancel(request_id)
        raise
    return [outcomes[i] for i in ids]


def failed_outcome(
    request: ExperimentRequest,
    cause: str,
    *,
    node: str = "",
    attempts: int = 1,
    wall_s: float = 0.0,
) -> ExecutionOutcome:
    """An outcome for an experiment that could not finish: verdict FAILED, the cause in words."""
    result = ExperimentResult(
        task=request.task,
        patch_id=request.patch.hash,
        verdict=Verdict.FAILED,
        reasons=[cause],
    )
    record = ExperimentRecord(
        run_id=request.run_id, task=request.task, patch_id=request.patch.hash,
        sandbox=request.sandbox, result=result, duration_s=wall_s,
    )  # fmt: skip
    return ExecutionOutcome(request_id=request.id, record=record, node=node, attempts=attempts,
                            wall_s=wall_s, overhead_s=wall_s)  # fmt: skip


def execute_request(
    request: ExperimentRequest, cpus: list[int] | None = None, gpus: list[int] | None = None
) -> ExecutionOutcome:
    """Run one request here and now (what every executor's worker does). Never raises for a
    candidate's failure: the cascade turns those into verdicts; an infrastructure error becomes
    a FAILED outcome naming it."""
    from infra_agent.experiments import run_experiment
    from infra_agent.tasks.registry import find_task

    start = time.perf_counter()
    node = socket.gethostname()
    if cpus:
        os.sched_setaffinity(0, cpus)  # sandboxes started below inherit this CPU set
    if gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    try:
        task = find_task(request.task)
        record = run_experiment(
            task, request.patch, sandbox=request.sandbox, params=dict(request.params) or None,
            run_id=request.run_id, seed=request.seed, extend=request.extend,
            max_patch_bytes=request.max_patch_bytes,
        )  # fmt: skip
    except Exception as exc:  # an executor must hand back a record, whatever happened
        wall = time.perf_counter() - start
        return failed_outcome(request, f"experiment crashed on {node}: {type(exc).__name__}: {exc}",
                              node=node, wall_s=wall)  # fmt: skip
    wall = time.perf_counter() - start
    record.result.evidence.extra.setdefault("node", node)
    if cpus:
        record.result.evidence.extra.setdefault("cpus", cpus)
    return ExecutionOutcome(request_id=request.id, record=record, node=node, wall_s=wall,
                            overhead_s=max(0.0, wall - record.duration_s))  # fmt: skip
