"""`infra-agent eval --executor ray --address ADDR` on a multi-node Ray cluster started here with
Ray's own cluster utilities (a head without CPUs for attempts, two worker nodes with different
CPUs, memory and custom resources): attempts are Ray tasks, the driver alone writes the store, a
worker node removed mid-attempt costs only that attempt's unfinished experiment (the attempt
continues on the other node from its last finished one, and the report says so), and Ctrl-C on
the driver cancels the cluster's work. Nothing is left running afterwards (psutil: no attempt
worker, no experiment process, no Ray process of the cluster)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ExperimentGate, quick_decode_task, run_cli

from infra_agent.evals.records import AttemptRecord, EvalStore
from infra_agent.store import open_store

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

MB = 1 << 20
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_memory_monitor_refresh_ms": "0"}
"""Loopback only, no token; and no memory monitor: it reads the whole machine's memory, which
other work here fills (SGLang servers of other tests), and would kill this cluster's workers."""


class TestCluster:
    """A head (no CPUs: the driver and its inbox only) and two worker nodes that differ."""

    def __init__(self) -> None:
        os.environ.update(ENV)
        self.temp = Path(tempfile.mkdtemp(prefix="ray-h38-", dir="/tmp"))  # short: socket paths
        common: dict[str, Any] = {"object_store_memory": 80 * MB, "temp_dir": str(self.temp)}
        self.cluster = Cluster()
        try:
            self.cluster.add_node(**common, num_cpus=0, include_dashboard=False)
            self.small = self.cluster.add_node(
                **common, num_cpus=2, memory=10 << 30, resources={"small_node": 1}
            )
            self.large = self.cluster.add_node(
                **common, num_cpus=3, memory=15 << 30, resources={"large_node": 1}
            )
            self.cluster.wait_for_nodes()
        except BaseException:  # a node that did not start: stop the ones that did
            self.shutdown()
            self.reap()
            raise

    def node(self, node_id: str) -> Any:
        return next(n for n in (self.small, self.large) if n.node_id == node_id)

    def shutdown(self) -> None:
        self.cluster.shutdown()

    def reap(self) -> None:
        """After a failed test or start: kill what any node left (found by the temp dir)."""
        import psutil

        for p in psutil.process_iter(["cmdline"]):
            if str(self.temp) in " ".join(p.info["cmdline"] or []):
                p.kill()
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture
def cluster() -> Iterator[TestCluster]:
    started = TestCluster()
    try:
        yield started
    finally:
        started.shutdown()
        started.reap()


REJECTED_DIFF = "\n".join(["--- a/attention.py", "+++ b/attention.py", "@@ -8,4 +8,5 @@",
                           " from __future__ import annotations", " ", "+import ctypes",
                           " import math", " ", ""])  # fmt: skip
"""Adds `import ctypes`: the static rules refuse it before any arm is prepared."""


def _task(tmp_path: Path) -> tuple[Path, ExperimentGate, Path]:
    """The quick decode task with every measured experiment held at a gate, and a script of two
    experiments: a patch the static rules refuse (REJECTED in well under a second, before any
    prepare stage: the attempt's first finished experiment) and a knob setting that is measured
    (it waits at the gate until the test opens it)."""
    task = quick_decode_task(tmp_path)
    gate = ExperimentGate(task, tmp_path / "gate", from_nth=1)
    replies = [
        {"content": "native", "tool_calls": [{"name": "propose_patch", "arguments": {
            "diff": REJECTED_DIFF, "rationale": "native code"}}]},
        {"content": "verify", "tool_calls": [{"name": "run_experiment", "arguments": {
            "patch_id": "{{last_patch_id}}"}}]},
        {"content": "2 splits", "tool_calls": [{"name": "propose_knobs", "arguments": {
            "knobs": {"num_splits": 2}, "rationale": "fewer re-reads"}}]},
        {"content": "verify", "tool_calls": [{"name": "run_experiment", "arguments": {
            "patch_id": "{{last_patch_id}}"}}]},
    ]  # fmt: skip
    script = tmp_path / "script.json"
    script.write_text(json.dumps(replies))
    return task, gate, script


def _driver(db: Path, task: Path, script: Path, attempts: int, address: str, log: Path) -> Any:
    args = ["--db", str(db), "eval", "--suite", str(task), "--policy", "scripted", "--script",
            str(script), "--attempts", str(attempts), "--no-reverify", "--executor", "ray",
            "--address", address, "--json"]  # fmt: skip
    with log.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "infra_agent.cli", *args], env={**os.environ, **ENV},
            stdout=subprocess.PIPE, stderr=err, start_new_session=True,
        )  # fmt: skip


def _attempts(db: Path) -> list[AttemptRecord]:
    if not db.exists():
        return []
    evals = EvalStore(db, readonly=True)
    try:
        found = evals.list_evals()
        return evals.attempts(found[0].id) if found else []
    finally:
        evals.close()


def _experiments(db: Path, run_id: str) -> list[str]:
    store = open_store(db, readonly=True)
    try:
        return [e.id for e in sorted(store.experiments(run_id), key=lambda e: e.started_at)]
    finally:
        store.close()


def _left_running(*tokens: str) -> list[str]:
    """Live processes (psutil, Ray's vendored copy) whose name or command line holds a token."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        text = " ".join([p.info["name"] or "", *(p.info["cmdline"] or [])])
        if any(t in text for t in tokens):
            found.append(f"{p.pid} {text[:160]}")
    return found


def _wait_gone(*tokens: str, limit_s: float = 30) -> list[str]:
    deadline = time.monotonic() + limit_s
    while (left := _left_running(*tokens)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_a_worker_node_lost_mid_attempt_costs_one_experiment(
    cluster: TestCluster, tmp_path: Path
) -> None:
    """Four attempts at once on two worker nodes (2 and 3 CPUs). Once the driver's store has
    each attempt's first experiment and every second experiment waits at the gate, the node of
    attempt #1 is removed, then the gate opens: the attempts lost there continue on the other
    node from their second experiment, and no experiment is run or stored twice."""
    task, gate, script = _task(tmp_path)
    db, log = tmp_path / "runs.db", tmp_path / "eval.log"
    proc = _driver(db, task, script, 4, cluster.cluster.address, log)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            ahead = [a for a in _attempts(db) if a.run_id and _experiments(db, a.run_id)]
            if len(ahead) == 4 and gate.started == 4:
                break
            time.sleep(0.1)
        kept = {a.id: _experiments(db, a.run_id or "") for a in ahead}
        node_id = ahead[0].placements[-1].node_id
        cluster.cluster.remove_node(cluster.node(node_id))
        gate.release()
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
    attempts = {a["id"]: a for a in json.loads(out)["attempts"]}
    assert [a["status"] for a in attempts.values()] == ["finished"] * 4
    for a in attempts.values():  # every attempt finished exactly once: one run, two experiments
        assert len(_experiments(db, a["run_id"])) == a["result"]["experiments"] == 2, a
        assert (
            a["result"]["verdicts"][0] == "REJECTED"
            and _experiments(db, a["run_id"])[:1] == kept[a["id"]]
        )
    store = open_store(db, readonly=True)
    assert {r.id for r in store.list_runs()} == {a["run_id"] for a in attempts.values()}
    store.close()
    lost = [a for a in attempts.values() if a["placements"][0]["node_id"] == node_id]
    assert lost and lost[0]["id"] == ahead[0].id
    survivor = cluster.large if cluster.node(node_id) is cluster.small else cluster.small
    for a in attempts.values():
        first, *rest = a["placements"]
        if a not in lost:
            assert [(first["outcome"], first["node_id"])] == [("finished", survivor.node_id)]
            continue
        assert a["run_id"] == next(b.run_id for b in ahead if b.id == a["id"])  # continued
        assert (first["node_id"], first["outcome"]) == (node_id, "lost")
        assert [(p["outcome"], p["from_experiments"], p["node_id"]) for p in rest] == [
            ("finished", 1, survivor.node_id)
        ]
        assert rest[0]["hardware"]["cpu_count"] and rest[0]["requested"]["CPU"] == 1
        assert rest[0]["ray_resources"]["CPU"] == (2 if survivor is cluster.small else 3)

    report = run_cli("--db", str(db), "eval", "report", json.loads(out)["eval"]["id"],
                     "--html", str(tmp_path / "report.html"))  # fmt: skip
    assert report.returncode == 0, report.stderr
    shown = " ".join(report.stdout.split())
    assert shown.count(f"retried on {survivor.node_id[:8]} from experiment 2") == len(lost)
    html = (tmp_path / "report.html").read_text()
    assert node_id[:8] in html and survivor.node_id[:8] in html and "lost" in html
    assert lost[0]["placements"][1]["hardware"]["cpu"] in html
    assert not _wait_gone("infra-agent attempt", "infra-agent-attempt-", str(task))
    cluster.shutdown()
    assert not _wait_gone(str(cluster.temp))


def test_ctrl_c_on_the_driver_cancels_the_cluster_work(
    cluster: TestCluster, tmp_path: Path
) -> None:
    """Every experiment waits at the gate; SIGINT to the driver while they wait cancels the
    tries: the driver exits 130, the eval is resumable, and no attempt process, held experiment
    or scratch store is left on any node (the cluster itself stays up for its owner)."""
    task, gate, script = _task(tmp_path)
    db, log = tmp_path / "runs.db", tmp_path / "eval.log"
    proc = _driver(db, task, script, 3, cluster.cluster.address, log)
    try:
        held = gate.wait_held(proc, log, limit_s=300)
        os.kill(proc.pid, signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, log.read_text()[-3000:]
    assert "resume with" in log.read_text()
    assert not _wait_gone("infra-agent attempt", "infra-agent-attempt-", str(task))
    assert not Path(f"/proc/{held}").exists() or _left_running(str(held)) == []
    evals = EvalStore(db, readonly=True)
    record = evals.list_evals()[0]
    assert record.status == "interrupted"
    assert all(a.status in ("pending", "running") for a in evals.attempts(record.id))
    tries = [p.outcome for a in evals.attempts(record.id) for p in a.placements]
    evals.close()
    assert "cancelled" in tries and "finished" not in tries
    gate.release()
