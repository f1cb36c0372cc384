"""The local executor (the embedded default): experiments in child processes on this machine,
one at a time, or N at a time on non-overlapping CPU sets for CPU-only tasks.

Each experiment runs in its own process, so a hang past the timeout or a crash of the process
costs that experiment only: it comes back FAILED with the cause, and the next one still runs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from infra_agent.experiments.executors.base import (
    ExecutionOutcome,
    ExperimentRequest,
    execute_request,
    failed_outcome,
)

_POLL_S = 0.1
_TERM_GRACE_S = 10.0
"""Seconds a timed-out experiment gets to clean its sandboxes after SIGTERM before SIGKILL."""


def _child(request_json: str, cpus: list[int] | None, conn: Connection) -> None:
    request = ExperimentRequest.model_validate_json(request_json)
    outcome = execute_request(request, cpus=cpus)
    conn.send(outcome.model_dump_json())
    conn.close()


@dataclass
class _Slot:
    request: ExperimentRequest
    cpus: list[int] | None
    process: BaseProcess
    conn: Connection
    started: float
    submitted: float
    attempts: int = 1


@dataclass
class LocalExecutor:
    """Run experiments in child processes, at most `parallel` at once."""

    parallel: int = 1
    """Concurrent experiments. Above 1, each gets its own CPU set (CPU-only tasks)."""
    cpus_per_experiment: int | None = None
    """Cores per experiment when parallel > 1; default: the machine's cores split evenly."""
    name: str = "local"
    _queue: list[tuple[ExperimentRequest, float, int]] = field(default_factory=list)
    _running: dict[str, _Slot] = field(default_factory=dict)
    _done: list[ExecutionOutcome] = field(default_factory=list)
    _free_cpu_sets: list[list[int] | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.parallel < 1:
            raise ValueError("parallel must be at least 1")
        if self.parallel == 1:
            self._free_cpu_sets = [None]
            return
        cores = sorted(os.sched_getaffinity(0))
        per = self.cpus_per_experiment or max(1, len(cores) // self.parallel)
        if per * self.parallel > len(cores):
            raise ValueError(
                f"{self.parallel} experiments x {per} cores need {per * self.parallel} cores; "
                f"this machine has {len(cores)}"
            )
        self._free_cpu_sets = [cores[i * per : (i + 1) * per] for i in range(self.parallel)]

    # -- Executor protocol -----------------------------------------------------------------
    def submit(self, request: ExperimentRequest) -> str:
        self._queue.append((request, time.perf_counter(), 1))
        return request.id

    def running(self) -> list[str]:
        return [r.id for r, _, _ in self._queue] + list(self._running)

    def cancel(self, request_id: str) -> bool:
        for i, (request, submitted, _attempts) in enumerate(self._queue):
            if request.id == request_id:
                del self._queue[i]
                self._done.append(failed_outcome(request, "cancelled before it started",
                                                 wall_s=time.perf_counter() - submitted))  # fmt: skip
                return True
        slot = self._running.get(request_id)
        if slot is None:
            return False
        self._stop(slot)
        self._finish(slot, None, "cancelled while running")
        return True

    def collect(self, timeout_s: float | None = None) -> list[ExecutionOutcome]:
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        try:
            while self._queue or self._running:
                self._start_queued()
                self._poll()
                if deadline is not None and time.perf_counter() > deadline:
                    break
                time.sleep(_POLL_S)
        except KeyboardInterrupt:
            self.shutdown()
            raise
        done, self._done = self._done, []
        return done

    def shutdown(self) -> None:
        for request, submitted, _ in self._queue:
            self._done.append(failed_outcome(request, "cancelled (executor shut down)",
                                             wall_s=time.perf_counter() - submitted))  # fmt: skip
        self._queue.clear()
        for slot in list(self._running.values()):
            self._stop(slot)
            self._finish(slot, None, "cancelled (executor shut down)")

    # -- internals -------------------------------------------------------------------------
    def _start_queued(self) -> None:
        ctx = mp.get_context("spawn")
        while self._queue and self._free_cpu_sets:
            request, submitted, attempts = self._queue.pop(0)
            cpus = self._free_cpu_sets.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=_child, args=(request.model_dump_json(), cpus, child), daemon=False,
                name=f"infra-agent-experiment-{request.id}",
            )  # fmt: skip
            process.start()
            child.close()
            self._running[request.id] = _Slot(request, cpus, process, parent,
                                              time.perf_counter(), submitted, attempts)  # fmt: skip

    def _poll(self) -> None:
        for slot in list(self._running.values()):
            if slot.conn.poll():
                try:
                    payload = slot.conn.recv()
                except EOFError:
                    payload = None
                slot.process.join(timeout=30)
                self._finish(slot, payload, None)
            elif not slot.process.is_alive():
                code = slot.process.exitcode
                cause = f"experiment worker died (exit code {code})"
                if slot.attempts < 2:
                    # A dead worker (killed, OOM) is retried once: the experiment itself is pure.
                    self._release(slot)
                    self._queue.insert(0, (slot.request, slot.submitted, slot.attempts + 1))
                else:
                    self._finish(slot, None, cause + "; retried once, died again")
            elif time.perf_counter() - slot.started > slot.request.timeout_s:
                self._stop(slot)
                self._finish(
                    slot, None, f"timed out after {slot.request.timeout_s:.0f} s (not retried)"
                )

    def _stop(self, slot: _Slot) -> None:
        """SIGTERM (the experiment cleans its sandboxes), then SIGKILL after a grace period."""
        if slot.process.is_alive() and slot.process.pid is not None:
            os.kill(slot.process.pid, signal.SIGTERM)
            slot.process.join(timeout=_TERM_GRACE_S)
        if slot.process.is_alive():
            slot.process.kill()
            slot.process.join(timeout=10)

    def _release(self, slot: _Slot) -> None:
        self._running.pop(slot.request.id, None)
        slot.conn.close()
        self._free_cpu_sets.append(slot.cpus)

    def _finish(self, slot: _Slot, payload: str | None, cause: str | None) -> None:
        self._release(slot)
        wall = time.perf_counter() - slot.submitted
        if payload is not None:
            outcome = ExecutionOutcome.model_validate_json(payload)
            outcome.attempts = slot.attempts
            outcome.wall_s = wall
            # From the process start, not from submission: time spent queued is not overhead.
            ran = time.perf_counter() - slot.started
            outcome.overhead_s = max(0.0, ran - outcome.record.duration_s)
        else:
            outcome = failed_outcome(slot.request, cause or "no result", attempts=slot.attempts,
                                     wall_s=wall)  # fmt: skip
        self._done.append(outcome)
