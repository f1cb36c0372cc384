"""The Ray executor: each experiment is a Ray task with declared resources, on a cluster
(`--executor ray --ray-address ADDR`) or on a local Ray started for you.

- Resources: `num_cpus`, `num_gpus` (Ray hands each task distinct GPU ids, so two experiments
  never share a GPU) and, for serving targets, the custom resource `infra_agent_node` (each node
  offers 1) that makes an experiment take a whole node.
- Hygiene: baseline and candidate are two arms of one experiment, which is one task, so they
  always run on the same node; the node is recorded in the evidence (`extra.node`).
- Faults: a worker that dies is retried once by Ray (`max_retries=1`); dying again, a lost node,
  or a hang past the timeout give a FAILED record naming the cause. Only the driver writes the
  run store. Ctrl-C cancels every outstanding experiment.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra_agent.experiments.executors.base import (
    ExecutionOutcome,
    ExperimentRequest,
    execute_request,
    failed_outcome,
)

NODE_RESOURCE = "infra_agent_node"
"""Custom resource every node offers once: requesting 1 takes the node exclusively."""


def _execute_remote(request_json: str, attempts_dir: str | None) -> str:
    import ray

    request = ExperimentRequest.model_validate_json(request_json)
    if attempts_dir:
        # One marker per start, so the driver can tell a retried experiment (same node only).
        marker = Path(attempts_dir) / f"{request.id}.{os.getpid()}"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(time.time()))
    gpus = [int(g) for g in ray.get_gpu_ids()] if request.resources.gpus else None
    return execute_request(request, gpus=gpus).model_dump_json()


def connect_ray(
    address: str | None, num_cpus: int | None = None, temp_dir: Path | None = None
) -> bool:
    """Join the cluster at `address`, or start a private loopback-only Ray here (`num_cpus`,
    default this machine's). False when this process was already connected (leave it so)."""
    import ray

    if ray.is_initialized():
        return False
    if address is None:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # loopback-only private cluster
        ray.init(
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=str(temp_dir) if temp_dir else None,
            resources={NODE_RESOURCE: 1},
            log_to_driver=False,
        )
    else:
        ray.init(address=address, log_to_driver=False)
    return True


@dataclass
class _Pending:
    request: ExperimentRequest
    ref: Any
    submitted: float


@dataclass
class RayExecutor:
    """Submit experiments as Ray tasks. `address=None` starts a private local Ray."""

    address: str | None = None
    num_cpus: int | None = None
    """CPUs of a locally started Ray (default: this machine's)."""
    temp_dir: Path | None = None
    """Ray's session folder for a locally started Ray (default: Ray's own)."""
    name: str = "ray"
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _done: list[ExecutionOutcome] = field(default_factory=list)
    _started_ray: bool = False
    _attempts_dir: Path | None = None

    def __post_init__(self) -> None:
        self._started_ray = connect_ray(self.address, self.num_cpus, self.temp_dir)
        if self.temp_dir is not None:
            self._attempts_dir = self.temp_dir / "infra-agent-attempts"

    def submit(self, request: ExperimentRequest) -> str:
        import ray

        res = request.resources
        options: dict[str, Any] = {
            "num_cpus": res.cpus,
            "num_gpus": res.gpus,
            "max_retries": 1,  # system failures only (a dead worker); never a candidate's error
            "retry_exceptions": False,
        }
        if res.exclusive_node:
            options["resources"] = {NODE_RESOURCE: 1}
        remote = ray.remote(_execute_remote).options(**options)
        attempts_dir = str(self._attempts_dir) if self._attempts_dir else None
        ref = remote.remote(request.model_dump_json(), attempts_dir)
        self._pending[request.id] = _Pending(request, ref, time.perf_counter())
        return request.id

    def running(self) -> list[str]:
        return list(self._pending)

    def cancel(self, request_id: str) -> bool:
        import ray

        pending = self._pending.pop(request_id, None)
        if pending is None:
            return False
        ray.cancel(pending.ref, force=True)
        self._done.append(failed_outcome(pending.request, "cancelled",
                                         wall_s=time.perf_counter() - pending.submitted))  # fmt: skip
        return True

    def collect(self, timeout_s: float | None = None) -> list[ExecutionOutcome]:
        import ray

        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        try:
            while self._pending:
                refs = [p.ref for p in self._pending.values()]
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.5)
                for ref in ready:
                    self._harvest(ref)
                self._expire()
                if deadline is not None and time.perf_counter() > deadline:
                    break
        except KeyboardInterrupt:
            self.shutdown()
            raise
        done, self._done = self._done, []
        return done

    def shutdown(self) -> None:
        import ray

        for request_id in list(self._pending):
            self.cancel(request_id)
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
            self._started_ray = False

    # -- internals -------------------------------------------------------------------------
    def _attempts(self, request_id: str) -> int:
        if self._attempts_dir is None or not self._attempts_dir.is_dir():
            return 1
        return max(1, len(list(self._attempts_dir.glob(f"{request_id}.*"))))

    def _harvest(self, ref: Any) -> None:
        import ray

        request_id = next(i for i, p in self._pending.items() if p.ref == ref)
        pending = self._pending.pop(request_id)
        wall = time.perf_counter() - pending.submitted
        attempts = self._attempts(request_id)
        try:
            outcome = ExecutionOutcome.model_validate_json(ray.get(ref))
        except ray.exceptions.WorkerCrashedError as exc:
            cause = f"experiment worker died twice (retried once): {str(exc).splitlines()[0]}"
            outcome = failed_outcome(pending.request, cause, attempts=attempts, wall_s=wall)
        except ray.exceptions.RayError as exc:  # node lost, owner died, task cancelled ...
            cause = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}"
            outcome = failed_outcome(pending.request, cause, attempts=attempts, wall_s=wall)
        else:
            outcome.attempts = attempts
            outcome.wall_s = wall
            outcome.overhead_s = max(0.0, wall - outcome.record.duration_s)
        self._done.append(outcome)

    def _expire(self) -> None:
        """Hangs past the timeout (counted from submission: Ray does not report start times)."""
        import ray

        now = time.perf_counter()
        for request_id, pending in list(self._pending.items()):
            if now - pending.submitted > pending.request.timeout_s:
                self._pending.pop(request_id)
                ray.cancel(pending.ref, force=True)
                cause = f"timed out after {pending.request.timeout_s:.0f} s (not retried)"
                self._done.append(
                    failed_outcome(pending.request, cause, wall_s=now - pending.submitted)
                )
