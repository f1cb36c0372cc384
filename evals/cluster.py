"""Attempts of an eval on a Ray cluster (`eval --executor ray [--address ADDR]`).

Each attempt is one Ray task (`evals.node.run_try`) with the resources its task asks for
(`evals.resources`); Ray places it on a node where all of them are free. The driver alone writes
the run store: a node sends each finished experiment's run to an inbox actor on the driver's
node, and the driver merges it (`evals.bundle`). A try whose node or worker dies is lost; the
attempt goes back to the queue and continues on another node from its last finished experiment
(the run and checkpoint the driver holds: the same resume `eval --resume` does), at most
`MAX_TRIES` times. Each try is recorded with the attempt (`Placement`: node, hardware, from
which experiment, how it ended), so the report names nodes and what was retried. Ctrl-C cancels
every try (each run is marked interrupted and its sandboxes cleaned), force-kills what has not
ended after a grace period, and the eval stays resumable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra_agent.config import Settings
from infra_agent.evals.board import Board, label, row
from infra_agent.evals.bundle import RunBundle, merge, read_bundle
from infra_agent.evals.node import NodeCall, NodeInfo, NodeReturn, TaskArchive, run_try
from infra_agent.evals.records import AttemptRecord, EvalRecord, EvalStore, Placement
from infra_agent.evals.resources import AttemptResources, attempt_resources
from infra_agent.store.records import now

MAX_TRIES = 3
"""Tries per attempt in one invocation (the first and two after lost nodes)."""
CANCEL_GRACE_S = 10.0
"""How long cancelled tries get to mark their runs interrupted before they are killed (Ray raises
KeyboardInterrupt in a try; one blocked in a system call sees it only when the call returns).
A killed try's processes die with it (sandboxes set PR_SET_PDEATHSIG)."""
_POLL_S = 0.5


class Inbox:
    """On the driver's node: tries report here (started, a finished experiment's run, a progress
    line); the driver drains it. A snapshot call returns once the inbox holds it."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, int, Any]] = []

    def started(self, attempt_id: str, try_index: int, info: NodeInfo) -> None:
        self.messages.append(("started", attempt_id, try_index, info))

    def snapshot(self, attempt_id: str, try_index: int, bundle: RunBundle) -> None:
        self.messages.append(("snapshot", attempt_id, try_index, bundle))

    def line(self, attempt_id: str, try_index: int, text: str) -> None:
        self.messages.append(("line", attempt_id, try_index, text))

    def drain(self) -> list[tuple[str, str, int, Any]]:
        out, self.messages = self.messages, []
        return out


class _Task:
    """What every attempt of one task shares: where it is here, its fingerprint, its request,
    and its folder in the object store (None for a task that comes with the package)."""

    def __init__(self, ref: str, search_path: list[Path]) -> None:
        import ray

        from infra_agent.experiments import task_fingerprint
        from infra_agent.tasks.registry import find_task

        task = find_task(ref, search_path)
        self.root = str(task.root)
        self.fingerprint = task_fingerprint(task)
        self.resources: AttemptResources = attempt_resources(task)
        shipped = "/" in ref or ref.startswith(".")
        # an object ref (or None) that Ray resolves to the TaskArchive on the node
        self.archive: Any = ray.put(TaskArchive.pack(task.root)) if shipped else None


def _no_node_fits(asked: AttemptResources) -> str | None:
    """Why no live node of the cluster could ever hold the attempt (None: one could)."""
    import ray

    need = asked.requested()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if any(all(r.get(k, 0.0) >= v for k, v in need.items() if v) for r in nodes):
        return None
    offered = "; ".join(
        f"CPU {r.get('CPU', 0):g}, GPU {r.get('GPU', 0):g}, memory {r.get('memory', 0) / 2**30:.1f} GiB"
        for r in nodes
    )
    return f"no node of the cluster can hold it ({asked.why}); nodes offer: {offered or 'none'}"


class ClusterEval:
    """The driver of one invocation: submits tries, merges what comes back, retries lost ones."""

    def __init__(
        self, record: EvalRecord, evals: EvalStore, settings: Settings,
        progress: Callable[[str], None], on_board: Callable[[Board], None] | None,
    ) -> None:  # fmt: skip
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.record, self.evals, self.settings = record, evals, settings
        self.store_path = settings.store.path()
        self.progress, self.on_board = progress, on_board
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.inbox: Any = ray.remote(Inbox).options(num_cpus=0, scheduling_strategy=here).remote()
        self.remote = ray.remote(run_try)
        self.tasks: dict[str, _Task] = {}
        self.attempts: dict[str, AttemptRecord] = {}
        self.tries: dict[Any, str] = {}  # the try's ObjectRef -> its attempt id
        self.patch_ids: dict[str, set[str]] = {}  # run id -> patches its nodes sent
        self.losses: dict[str, int] = {}  # attempt id -> its tries lost in this invocation

    # -- submitting --------------------------------------------------------------------------
    def submit(self, attempt: AttemptRecord) -> None:
        if attempt.task not in self.tasks:
            self.tasks[attempt.task] = _Task(attempt.task, self.settings.tasks.search_path)
        task = self.tasks[attempt.task]
        refused = _no_node_fits(task.resources)
        if refused:
            attempt.status, attempt.reason = "failed", refused
            self.evals.put_attempt(attempt)
            self.progress(f"{label(attempt)}: failed: {refused}")
            return
        known = self.patch_ids.get(attempt.run_id or "", set())
        bundle = (
            read_bundle(self.store_path, attempt.run_id, patch_ids=known)
            if attempt.run_id
            else None
        )
        placement = Placement(requested=task.resources.requested(),
                              from_experiments=bundle.finished_experiments if bundle else 0)  # fmt: skip
        attempt.placements.append(placement)
        self.evals.put_attempt(attempt)
        self.attempts[attempt.id] = attempt
        call = NodeCall(eval=self.record, attempt=attempt, settings=self.settings,
                        try_index=len(attempt.placements), fingerprint=task.fingerprint,
                        bundle=bundle)  # fmt: skip
        options = {**task.resources.ray_options(), "max_retries": 0, "retry_exceptions": False,
                   "name": f"infra-agent attempt {label(attempt)}"}  # fmt: skip
        ref = self.remote.options(**options).remote(call, task.archive, self.inbox)
        self.tries[ref] = attempt.id
        again = f" from experiment {placement.from_experiments + 1}" if bundle else ""
        self.progress(f"{label(attempt)}: queued{again} ({task.resources.why})")

    # -- what comes back ---------------------------------------------------------------------
    def _current(self, attempt_id: str, try_index: int) -> AttemptRecord | None:
        attempt = self.attempts.get(attempt_id)
        ok = attempt is not None and len(attempt.placements) == try_index
        return attempt if ok else None

    def drain(self) -> None:
        import ray

        for kind, attempt_id, try_index, payload in ray.get(self.inbox.drain.remote()):
            attempt = self._current(attempt_id, try_index)
            if attempt is None:
                continue  # a message from a try already given up on
            if kind == "line":
                self.progress(f"{label(attempt)}{payload}")
            elif kind == "started":
                self._started(attempt, payload)
            elif kind == "snapshot":
                self._merge(attempt, payload)
                attempt.status = "running"
                self.evals.put_attempt(attempt)

    def _started(self, attempt: AttemptRecord, info: NodeInfo) -> None:
        import ray

        place = attempt.placements[-1]
        found = [n for n in ray.nodes() if n.get("NodeID") == info.node_id]
        place.ray_resources = dict(found[0].get("Resources", {})) if found else {}
        place.node_id, place.node, place.hardware = info.node_id, info.node, info.hardware
        place.outcome, place.started_at = "running", now()
        self.evals.put_attempt(attempt)
        self.progress(f"{label(attempt)}: running on {info.node_id[:8]} ({info.node})")

    def _merge(self, attempt: AttemptRecord, bundle: RunBundle | None) -> None:
        if bundle is not None:
            merge(self.store_path, bundle, task_root=self.tasks[attempt.task].root)
            attempt.run_id = bundle.run.id
            self.patch_ids.setdefault(bundle.run.id, set()).update(p.id for p in bundle.patches)

    def harvest(self, ref: Any) -> None:
        """A try ended: merge its run, or requeue its attempt if its node or worker was lost."""
        import ray

        attempt = self.attempts[self.tries.pop(ref)]
        place = attempt.placements[-1]
        place.ended_at = now()
        try:
            back: NodeReturn = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # the try raised: not a lost node
            cause = str(exc.cause) if exc.cause is not None else str(exc).splitlines()[0]
            place.outcome, place.detail = "failed", cause[:300]
            attempt.status, attempt.reason = "failed", f"on {place.node or 'a node'}: {cause}"[:300]
        except ray.exceptions.RayError as exc:  # node lost, worker killed, object lost
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            place.outcome, place.detail = "lost", f"{type(exc).__name__}: {why}"[:300]
            self.evals.put_attempt(attempt)
            where = f"{place.node_id[:8]} ({place.node})" if place.node_id else "its node"
            self.losses[attempt.id] = self.losses.get(attempt.id, 0) + 1
            if self.losses[attempt.id] < MAX_TRIES:
                self.progress(f"{label(attempt)}: lost on {where}; retrying")
                self.submit(attempt)
                return
            attempt.status, attempt.reason = "failed", f"lost {MAX_TRIES} times: {place.detail}"
        else:
            self._merge(attempt, back.bundle)
            for field in ("status", "run_id", "abandoned_runs", "reason", "result"):
                setattr(attempt, field, getattr(back.attempt, field))
            place.outcome = "finished"
        self.evals.put_attempt(attempt)
        why = f": {attempt.reason}" if attempt.reason else ""
        self.progress(f"{label(attempt)}: {attempt.status} on {place.node_id[:8]}{why}")

    def board(self) -> Board:
        return Board(rows=[row(a) for a in self.attempts.values()])

    # -- Ctrl-C ------------------------------------------------------------------------------
    def cancel(self) -> None:
        """Cancel every try (KeyboardInterrupt in each: its run is marked interrupted and its
        sandboxes cleaned), wait `CANCEL_GRACE_S`, kill what is left; keep what came in."""
        import ray

        pending = list(self.tries)
        for ref in pending:
            ray.cancel(ref, force=False)
        try:
            deadline = time.monotonic() + CANCEL_GRACE_S
            while pending and time.monotonic() < deadline:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=_POLL_S)
        except KeyboardInterrupt:  # a second Ctrl-C: kill now
            pass
        for ref in pending:
            ray.cancel(ref, force=True)
        try:
            self.drain()
        except ray.exceptions.RayError:
            pass
        for attempt_id in self.tries.values():
            attempt = self.attempts[attempt_id]
            attempt.placements[-1].outcome, attempt.placements[-1].ended_at = "cancelled", now()
            self.evals.put_attempt(attempt)
        self.tries.clear()

    def close(self) -> None:
        import ray

        try:
            ray.kill(self.inbox)
        except ray.exceptions.RayError:  # already gone with its node or the connection
            pass


def run_on_cluster(
    eval_id: str,
    attempt_ids: list[str],
    settings: Settings,
    progress: Callable[[str], None],
    address: str | None = None,
    on_board: Callable[[Board], None] | None = None,
) -> None:
    """Run the attempts on the Ray cluster at `address` (None: a private Ray on this machine);
    returns when each has finished, failed, or was lost `MAX_TRIES` times."""
    import ray

    from infra_agent.experiments.executors.ray import connect_ray

    evals = EvalStore(settings.store.path())
    started = connect_ray(address, temp_dir=None)
    driver: ClusterEval | None = None
    try:
        record = evals.get_eval(eval_id)
        assert record is not None
        driver = ClusterEval(record, evals, settings, progress, on_board)
        for attempt in evals.attempts(eval_id):
            if attempt.id in attempt_ids:
                driver.submit(attempt)
        try:
            while driver.tries:
                ready, _ = ray.wait(list(driver.tries), num_returns=1, timeout=_POLL_S)
                driver.drain()
                for ref in ready:
                    driver.harvest(ref)
                if on_board is not None:
                    on_board(driver.board())
        except KeyboardInterrupt:
            driver.cancel()
            raise
    finally:
        if driver is not None:
            driver.close()
        evals.close()
        if started:
            ray.shutdown()
