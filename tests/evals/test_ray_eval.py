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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import ExperimentGate, needs_sglang_env, quick_decode_task, run_cli, stoppable

from infra_agent.evals.records import AttemptRecord, EvalStore
from infra_agent.store import open_store

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

MB = 1 << 20
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_memory_monitor_refresh_ms": "0"}
"""Loopback only, no token; and no memory monitor: it reads the whole machine's memory, which
other work here fills (SGLang servers of other tests), and would kill this cluster's workers."""


SHARED_NODES: dict[str, dict[str, Any]] = {
    "small": {"num_cpus": 2, "memory": 10 << 30},
    "large": {"num_cpus": 3, "memory": 15 << 30},
}
"""The module cluster's worker nodes (each also offers a custom resource, `<name>_node`)."""


class LocalCluster:
    """A head (no CPUs: the driver and its inbox only) and worker nodes that differ. The nodes'
    temporary folders (TMPDIR: an attempt's scratch store and experiment folders) are inside the
    cluster's own, so a node killed mid-attempt leaves nothing behind once the cluster is reaped."""

    def __init__(self, workers: dict[str, dict[str, Any]] = SHARED_NODES) -> None:
        os.environ.update(ENV)
        self.temp = Path(tempfile.mkdtemp(prefix="ray-h38-", dir="/tmp"))  # short: socket paths
        self.tmpdir = self.temp / "tmp"
        (self.tmpdir / "ray").mkdir(parents=True)  # Ray writes the head's address there
        common: dict[str, Any] = {"object_store_memory": 80 * MB, "temp_dir": str(self.temp)}
        self.cluster = Cluster()
        outer = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(self.tmpdir)  # the nodes' processes inherit it
        try:
            self.cluster.add_node(**common, num_cpus=0, include_dashboard=False)
            self.workers = {
                name: self.cluster.add_node(**common, **args, resources={f"{name}_node": 1})
                for name, args in workers.items()
            }
            self.cluster.wait_for_nodes()
        except BaseException:  # a node that did not start: stop the ones that did
            self.shutdown()
            self.reap()
            raise
        finally:
            if outer is None:
                del os.environ["TMPDIR"]
            else:
                os.environ["TMPDIR"] = outer

    @property
    def small(self) -> Any:
        return self.workers["small"]

    @property
    def large(self) -> Any:
        return self.workers["large"]

    def node(self, node_id: str) -> Any:
        return next(n for n in self.workers.values() if n.node_id == node_id)

    def shutdown(self) -> None:
        self.cluster.shutdown()

    def reap(self) -> None:
        """After a failed test or start: kill what any node left (found by the temp dir)."""
        import psutil

        for p in psutil.process_iter(["cmdline"]):
            if str(self.temp) in " ".join(p.info["cmdline"] or []):
                p.kill()
        shutil.rmtree(self.temp, ignore_errors=True)


@contextmanager
def _running_cluster(workers: dict[str, dict[str, Any]] = SHARED_NODES) -> Iterator[LocalCluster]:
    """A cluster for the `with` body; afterwards no raylet, GCS or worker of it is left. A node
    that does not register within Ray's fixed 30 s (seen at load 27) is started again, once."""
    try:
        started = LocalCluster(workers)
    except Exception as exc:
        if "timed out during startup" not in str(exc):
            raise
        started = LocalCluster(workers)
    try:
        yield started
        started.shutdown()
        left = _wait_gone(str(started.temp))
        assert not left, left
    finally:
        started.shutdown()
        started.reap()


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """One cluster for the module's fast tests (a start is 25-35 s here): the Ctrl-C test leaves
    it as it found it (that is what it checks), and the node test, which removes a node, runs
    last."""
    with _running_cluster() as started:
        yield started


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


def _driver(db: Path, address: str, log: Path, *eval_args: str) -> Any:
    """`infra-agent eval ... --executor ray --address ADDR --json` in its own session."""
    args = ["--db", str(db), "eval", *eval_args, "--executor", "ray", "--address", address,
            "--json"]  # fmt: skip
    with log.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "infra_agent.cli", *args], env={**os.environ, **ENV},
            stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            preexec_fn=stoppable,  # stopped with Ctrl-C, also when this run ignores SIGINT
        )  # fmt: skip


def _scripted(task: Path, script: Path, attempts: int) -> list[str]:
    return ["--suite", str(task), "--policy", "scripted", "--script", str(script), "--attempts",
            str(attempts), "--no-reverify"]  # fmt: skip


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


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(*tokens: str, limit_s: float = 30) -> list[str]:
    deadline = time.monotonic() + limit_s
    while (left := _left_running(*tokens)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


SERVING_NODES: dict[str, dict[str, Any]] = {
    "lean": {"num_cpus": 4, "memory": 6 << 30},  # a serving attempt's cores, not its memory
    "large": {"num_cpus": 3, "memory": 12 << 30},
    "larger": {"num_cpus": 4, "memory": 14 << 30},
}
"""Worker nodes for the serving eval: a serving attempt (3 CPUs, 8.75 GiB) fits on two of
them, so it can go on after one is killed; a Python attempt (1 CPU, 4.75 GiB) fits on each."""


class NodeProcesses:
    """Every process that ran under the worker nodes' raylets (psutil, every 0.2 s on a thread),
    so that one reparented when its node was killed is still known."""

    def __init__(self, nodes: dict[str, Any]) -> None:
        import psutil

        self.raylets = {
            n.node_id: psutil.Process(n.all_processes["raylet"][0].process.pid)
            for n in nodes.values()
        }
        self.seen: dict[tuple[int, float], tuple[str, Any, str]] = {}
        """(pid, start time) -> (its node's id, the psutil.Process, name and command line)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        import psutil

        while not self._stop.is_set():
            for node_id, raylet in self.raylets.items():
                try:
                    below = raylet.children(recursive=True)
                except psutil.Error:  # the node is gone
                    continue
                for p in below:
                    try:
                        key = (p.pid, p.create_time())
                        if key not in self.seen:
                            self.seen[key] = (node_id, p, " ".join([p.name(), *p.cmdline()]))
                    except psutil.Error:
                        pass
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def not_ray(self, node_id: str | None = None) -> list[tuple[str, Any, str]]:
        """Those that are not Ray's own (workers, agents): attempts' sandboxes, SGLang servers."""
        return [
            (n, p, text)
            for n, p, text in list(self.seen.values())
            if (node_id is None or n == node_id) and "ray::" not in text and "/ray/" not in text
        ]

    @staticmethod
    def alive(found: list[tuple[str, Any, str]]) -> list[str]:
        import psutil

        out = []
        for _, p, text in found:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid} {text[:160]}")
            except psutil.Error:
                pass
        return out


def _quick_copy(parent: Path, name: str) -> Path:
    """Another quick decode task, under its own name."""
    folder = quick_decode_task(parent)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('"decode-split-norm-quick"', f'"{name}"'))
    return folder.rename(parent / name)


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.sglang
@pytest.mark.timeout(3600)
@needs_sglang_env()
def test_an_eval_with_a_serving_attempt_survives_losing_its_node(tmp_path: Path) -> None:
    """Long tier: a real SGLang serving experiment is minutes on this machine (this test: 659 s
    at load 10-16, 413 s at load 6-11; its retried serving try alone ran 9 minutes at load 10-16).
    An eval of four attempts, the search policy with one experiment each, on a cluster of three
    worker nodes: three bundled CPU attempts (decode-split-norm by name, two copies of it with a
    smaller problem shipped as folders) and one on sglang-cpu-tiny (two real SGLang servers on
    the CPU). The serving attempt asks Ray for both arms' server cores and memory, so it never
    lands on the node that has the cores but not the memory. Once its servers are starting, its
    node is killed (SIGKILL, no grace): the attempt starts again on the other node that can hold
    it, every attempt finishes exactly once in the driver's store (one run, one experiment), and
    nothing that ran under a worker node is left (no SGLang server, no sandbox or attempt
    process; after the cluster's shutdown, no Ray process either).
    Covered in the main tier by the module's node-loss and Ctrl-C tests (bundled CPU task) and
    test_an_attempt_asks_for_what_its_task_needs (a serving task's request)."""
    from infra_agent.evals.resources import ATTEMPT_PROCESS_MB
    from infra_agent.tasks.registry import find_task

    serving_cap = find_task("sglang-cpu-tiny").manifest.budget.memory_mb
    quick, quick_b = quick_decode_task(tmp_path), _quick_copy(tmp_path / "b", "decode-quick-b")
    db, log = tmp_path / "runs.db", tmp_path / "eval.log"
    with _running_cluster(SERVING_NODES) as started:
        watcher = NodeProcesses(started.workers)
        args = ["--suite", "decode-split-norm", "--suite", str(quick), "--suite", str(quick_b),
                "--suite", "sglang-cpu-tiny", "--policy", "search", "--budget", "1",
                "--attempts", "1", "--no-reverify"]  # fmt: skip
        proc = _driver(db, started.cluster.address, log, *args)
        try:
            deadline = time.monotonic() + 1800
            while True:  # until the serving attempt's SGLang servers are starting on its node
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                found = [a for a in _attempts(db) if a.task == "sglang-cpu-tiny"]
                place = found[0].placements[-1] if found and found[0].placements else None
                if place is not None and place.outcome == "running":
                    mine = watcher.not_ray(place.node_id)
                    if any("sglang.launch_server" in text for _, _, text in mine):
                        break
                time.sleep(0.5)
            killed = place.node_id
            servers = [s for s in watcher.not_ray(killed) if "sglang" in s[2]]
            started.cluster.remove_node(started.node(killed), allow_graceful=False)
            out, _ = proc.communicate(timeout=3000)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert proc.returncode == 0, log.read_text()[-3000:]
        assert out.startswith(b"{"), out[:3000]  # stdout: the report's JSON only
        report = json.loads(out)
        attempts = {Path(a["task"]).name: a for a in report["attempts"]}
        assert len(attempts) == 4 and all(a["status"] == "finished" for a in attempts.values()), [
            (name, a["status"], a["reason"]) for name, a in attempts.items()
        ]
        for a in attempts.values():  # exactly once: one run per attempt, one experiment each
            assert len(_experiments(db, a["run_id"])) == a["result"]["experiments"] == 1, a
        store = open_store(db, readonly=True)
        assert {r.id for r in store.list_runs()} == {a["run_id"] for a in attempts.values()}
        store.close()

        serving = attempts["sglang-cpu-tiny"]
        assert serving["result"]["verdicts"][0] != "FAILED", log.read_text()[-3000:]
        first, *rest = serving["placements"]
        assert (first["node_id"], first["outcome"]) == (killed, "lost")
        assert [(p["outcome"], p["from_experiments"]) for p in rest] == [("finished", 0)]
        asked = first["requested"]
        memory = float((ATTEMPT_PROCESS_MB + 2 * serving_cap) << 20)
        assert asked == {"CPU": 3.0, "GPU": 0.0, "memory": memory}
        lean = started.workers["lean"].node_id
        for p in serving["placements"]:  # only where both arms' servers fit
            offered = p["ray_resources"]
            assert p["node_id"] != lean
            assert offered["CPU"] >= asked["CPU"] and offered["memory"] >= asked["memory"]
        for a in attempts.values():  # a try lost with the node is followed by one that finished
            outcomes = [p["outcome"] for p in a["placements"]]
            assert outcomes in (["finished"], ["lost", "finished"]), (a["task"], outcomes)

        # Nothing that ran under a worker node is left but Ray's own processes of the live ones.
        assert servers and watcher.alive(servers) == [], servers  # the killed node's servers
        deadline = time.monotonic() + 30
        while (left := watcher.alive(watcher.not_ray())) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, left
        assert not _wait_gone("infra-agent attempt", "infra-agent-attempt-", str(quick))
        lost = sum(p["outcome"] == "lost" for a in attempts.values() for p in a["placements"])
        scratch = list(started.tmpdir.glob("infra-agent-attempt-*"))
        assert len(scratch) <= lost, scratch  # only lost tries' (reaped with the cluster)
    watcher.stop()
    assert watcher.alive(list(watcher.seen.values())) == []  # Ray's too, after the shutdown


@pytest.mark.slow
def test_ctrl_c_on_the_driver_cancels_the_cluster_work(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Every experiment waits at the gate; SIGINT to the driver while they wait cancels the
    tries: the driver exits 130, the eval is resumable, and no attempt process, held experiment
    or scratch store is left on any node (the cluster itself stays up for its owner). The
    local path then resumes the eval from the driver's store alone.

    44 s at load 3 (and 7 s for the cluster's start, shared with the next test); over 60 s when
    the machine is loaded: the first attempt processes' start and imports on a fresh node and
    the 10 s the cancelled tries get (84 s at load 24, 203 s at load 40)."""
    task, gate, script = _task(tmp_path)
    db, log = tmp_path / "runs.db", tmp_path / "eval.log"
    proc = _driver(db, cluster.cluster.address, log, *_scripted(task, script, 2))
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
    assert not _alive(held)  # the experiment that waited at the gate
    evals = EvalStore(db, readonly=True)
    record = evals.list_evals()[0]
    assert record.status == "interrupted"
    assert all(a.status in ("pending", "running") for a in evals.attempts(record.id))
    tries = [p.outcome for a in evals.attempts(record.id) for p in a.placements]
    before = {a.id: a.run_id for a in evals.attempts(record.id)}
    evals.close()
    assert "cancelled" in tries and "finished" not in tries
    kept = {i: _experiments(db, r) for i, r in before.items() if r}
    assert any(kept.values())  # the held attempt's first experiment reached the driver
    gate.release()
    # The driver's store alone carries the runs: the local path continues them.
    done = run_cli("--db", str(db), "eval", "--resume", record.id, "--json", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for a in json.loads(done.stdout)["attempts"]:
        assert a["status"] == "finished" and a["result"]["experiments"] == 2, a
        if a["id"] in kept:
            assert a["run_id"] == before[a["id"]]
            assert _experiments(db, a["run_id"])[: len(kept[a["id"]])] == kept[a["id"]]


@pytest.mark.slow
def test_a_worker_node_lost_mid_attempt_costs_one_experiment(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Four attempts at once on two worker nodes (2 and 3 CPUs). Once the driver's store has
    each attempt's first experiment and every second experiment waits at the gate, the node of
    attempt #1 is removed, then the gate opens: the attempts lost there continue on the other
    node from their second experiment, and no experiment is run or stored twice.

    44 s at load 3; over 60 s when the machine is loaded: four attempts and the retried ones on
    a 2-core machine, two measured experiments at a time (122 s at load 35, 128 s at load 14)."""
    task, gate, script = _task(tmp_path)
    db, log = tmp_path / "runs.db", tmp_path / "eval.log"
    proc = _driver(db, cluster.cluster.address, log, *_scripted(task, script, 4))
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


def test_an_attempt_asks_for_what_its_task_needs() -> None:
    """A Python task: one core and its candidate's memory cap; a serving task: both arms' server
    threads and a core, the cap per arm, and the GPUs its deployment names."""
    from infra_agent.evals.resources import ATTEMPT_PROCESS_MB, attempt_resources
    from infra_agent.tasks.registry import find_task

    python = find_task("example-matmul")
    mine = attempt_resources(python)
    cap = python.manifest.budget.memory_mb
    assert (mine.cpus, mine.gpus, mine.memory_mb) == (1, 0, ATTEMPT_PROCESS_MB + cap)
    assert mine.ray_options() == {"num_cpus": 1, "num_gpus": 0, "memory": mine.memory_mb << 20}
    tiny, gpu = (
        attempt_resources(find_task("sglang-cpu-tiny")),
        attempt_resources(find_task("sglang-gpu-example")),
    )
    assert (tiny.cpus, tiny.gpus) == (3, 0)  # OMP_NUM_THREADS = 1 per server, x2 arms, +1
    assert (gpu.cpus, gpu.gpus) == (3, 8) and "8 GPU(s)" in gpu.why


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--address", "127.0.0.1:1"], "--address is for --executor ray"),
        (["--executor", "ray", "--parallel-attempts", "2"], "for local runs"),
        (["--executor", "dask"], "is not local or ray"),
    ],
)
def test_cluster_flags_that_do_not_fit_are_one_line_errors(
    tmp_path: Path, flags: list[str], says: str
) -> None:
    db = tmp_path / "runs.db"
    done = run_cli("--db", str(db), "eval", "--suite", "example-matmul", *flags)
    assert done.returncode != 0 and says in done.stderr and "Traceback" not in done.stderr
    assert not db.exists()  # nothing recorded


def test_the_live_table_shows_queued_running_on_a_node_and_requeued() -> None:
    from infra_agent.evals.board import Board, row
    from infra_agent.evals.records import Placement

    attempt = AttemptRecord(id="e/t/0", eval_id="e", task="/x/decode-split-norm-quick", index=0)
    assert row(attempt).state == "queued"
    attempt.placements.append(
        Placement(node_id="abcdef0123", node="vm 10.0.0.2", outcome="running")
    )
    shown = row(attempt)
    assert (shown.state, shown.node, shown.tries) == ("running", "abcdef01 vm 10.0.0.2", 1)
    attempt.placements[-1].outcome = "lost"
    assert row(attempt).state == "lost (requeued)"
    attempt.placements.append(Placement())
    attempt.status = "finished"
    board = Board(rows=[row(attempt), shown])
    assert board.counts() == {"finished": 1, "running": 1}
    assert board.render().row_count == 2
