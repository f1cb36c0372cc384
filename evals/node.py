"""One try of an attempt on a Ray node: the Ray task body of `eval --executor ray`.

The node runs the attempt exactly as the local path does (`evals.attempt.run_attempt`: start or
resume the run, read its result, re-verify its best win), against a scratch run store of its own
in a private temporary folder, seeded with the driver's copy of the run when the attempt
continues (a retry after a lost node). It never opens the driver's store: after each finished
experiment it hands the whole run (`evals.bundle`) to the driver's inbox and waits until the
inbox has it, so a node lost later costs at most the experiment under way; the final bundle and
the attempt record are its return value.

What must exist on a node: the same Python environment with infra-agent installed (Ray's own
rule for a cluster), and for serving tasks the SGLang environment `make setup` builds
(~/.cache/infra-agent/sglang-0.5.23-venv), a node-local cache. A bundled task comes with the
package; a task folder travels as an archive through Ray's object store and is unpacked once
per content into ~/.cache/infra-agent/ray-tasks on the node. The task's fingerprint must match
the driver's, or the try fails naming the node.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import socket
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra_agent.config import Settings, StoreSettings
from infra_agent.evals.attempt import run_attempt
from infra_agent.evals.bundle import RunBundle, read_bundle, seed
from infra_agent.evals.records import AttemptRecord, EvalRecord, EvalStore
from infra_agent.store import open_store
from infra_agent.store.records import Hardware

TASK_CACHE = Path("~/.cache/infra-agent/ray-tasks")


class TaskArchive(BaseModel):
    """A task folder packed on the driver (tar.gz of its files, caches left out)."""

    name: str
    digest: str
    data: bytes

    @staticmethod
    def pack(folder: Path) -> TaskArchive:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            tar.add(folder, arcname=folder.name,
                    filter=lambda i: None if "__pycache__" in i.name else i)  # fmt: skip
        data = buffer.getvalue()
        return TaskArchive(name=folder.name, digest=hashlib.sha256(data).hexdigest(), data=data)

    def unpack(self) -> Path:
        """The folder on this node (unpacked once per content, atomically)."""
        home = TASK_CACHE.expanduser() / self.digest[:16]
        folder = home / self.name
        if folder.is_dir():
            return folder
        home.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=home, prefix=".unpack-"))
        with tarfile.open(fileobj=io.BytesIO(self.data), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
        try:
            os.replace(staging / self.name, folder)
        except OSError:  # another try unpacked it first
            if not folder.is_dir():
                raise
        shutil.rmtree(staging, ignore_errors=True)
        return folder


class NodeCall(BaseModel):
    """What the driver sends for one try."""

    eval: EvalRecord
    attempt: AttemptRecord
    settings: Settings
    try_index: int
    fingerprint: str
    """The driver's `task_fingerprint` of the attempt's task."""
    bundle: RunBundle | None = None
    """The run so far (None: a fresh run)."""


class NodeInfo(BaseModel):
    """Where a try started, as the node itself sees it."""

    node_id: str
    node: str
    hardware: Hardware


class NodeReturn(BaseModel):
    """What a finished try hands back: the attempt as the node recorded it, and its run."""

    attempt: AttemptRecord
    bundle: RunBundle | None = None


def _node_info(sandbox: str) -> NodeInfo:
    import ray

    from infra_agent.sandboxes.host import capture_environment

    host = f"{socket.gethostname()} {ray.util.get_node_ip_address()}"
    hardware = capture_environment(sandbox).hardware
    return NodeInfo(node_id=ray.get_runtime_context().get_node_id(), node=host, hardware=hardware)


def _task_here(call: NodeCall, archive: TaskArchive | None) -> str:
    """The attempt's task reference on this node, checked against the driver's fingerprint."""
    from infra_agent.errors import UserError
    from infra_agent.experiments import task_fingerprint
    from infra_agent.tasks.registry import find_task

    ref = str(archive.unpack()) if archive is not None else call.attempt.task
    mine = task_fingerprint(find_task(ref, call.settings.tasks.search_path))
    if mine != call.fingerprint:
        raise UserError(
            f"task {call.attempt.task} on node {socket.gethostname()} differs from the driver's "
            f"(fingerprint {mine[:12]} vs {call.fingerprint[:12]}): install the same infra-agent"
        )
    return ref


def run_try(call: NodeCall, archive: TaskArchive | None, inbox: Any) -> NodeReturn:
    """Run one try of the attempt here; snapshots go to `inbox` (an `evals.cluster.Inbox`)."""
    import ray

    config_sandbox = str(call.eval.config.get("sandbox") or call.settings.sandbox.backend)
    ray.get(inbox.started.remote(call.attempt.id, call.try_index, _node_info(config_sandbox)))
    scratch = Path(tempfile.mkdtemp(prefix="infra-agent-attempt-"))
    try:
        db = scratch / "runs.db"
        open_store(db).close()  # the run store's own schema before the eval tables
        attempt = call.attempt.model_copy(update={"task": _task_here(call, archive)})
        if call.bundle is not None:
            seed(db, call.bundle, task_root=attempt.task if archive is not None else None)
        settings = call.settings.model_copy(update={"store": StoreSettings(db=db)})
        evals = EvalStore(db)
        seen = [call.bundle.finished_experiments if call.bundle else 0]
        patches: set[str] = {p.id for p in call.bundle.patches} if call.bundle else set()

        def on_state(values: dict[str, Any]) -> None:
            patches.update(values.get("patches") or [])
            done = len(values.get("experiments") or [])
            if done > seen[0] and attempt.run_id is not None:
                seen[0] = done
                snapshot = read_bundle(db, attempt.run_id, whole_store=True, patch_ids=patches)
                ray.get(inbox.snapshot.remote(call.attempt.id, call.try_index, snapshot))

        def progress(text: str) -> None:
            inbox.line.remote(call.attempt.id, call.try_index, text)

        try:
            run_attempt(call.eval, attempt, settings, evals, progress, on_state=on_state)
        finally:
            evals.close()
        bundle = (
            read_bundle(db, attempt.run_id, whole_store=True, patch_ids=patches)
            if attempt.run_id
            else None
        )
        return NodeReturn(attempt=attempt, bundle=bundle)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
