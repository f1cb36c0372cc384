"""The same eval on the local path and on the Ray path, side by side: wall time and per-attempt
overhead.

    .venv/bin/python benchmarks/bench_eval_ray.py [--attempts 4] [--slots 1 2]

The eval: a copy of decode-split-norm with a small problem (tests/support.py's quick task), the
scripted policy proposing one knob setting and measuring it (one experiment per attempt),
`--no-reverify`, N attempts. Each configuration is one `infra-agent eval` process, timed from
start to exit. For each number of slots S (attempts at once): local runs them in order (S=1) or
with `--parallel-attempts S`; Ray runs them on a cluster started here beforehand with Ray's own
utilities (one node offering S CPUs; its start is timed apart, as a cluster is started once for
many evals) through `--executor ray --address`.

Overhead per attempt = (eval wall x S - the attempts' runs' own wall time, summed) / N: the slot
time an attempt holds beyond its run (process or Ray task start, imports, the scratch store and
the transfers to the driver, the re-read of results, the driver's own start and report).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

REPLIES = [
    {"content": "fewer splits", "tool_calls": [{"name": "propose_knobs", "arguments": {
        "knobs": {"num_splits": 2}, "rationale": "each split re-reads the keys"}}]},
    {"content": "verify", "tool_calls": [{"name": "run_experiment", "arguments": {
        "patch_id": "{{last_patch_id}}"}}]},
]  # fmt: skip


def _eval(folder: Path, task: Path, attempts: int, extra: list[str]) -> tuple[float, float, int]:
    """(wall s, the runs' own wall time summed, finished attempts) of one eval process."""
    db = folder / "runs.db"
    script = folder / "script.json"
    script.write_text(json.dumps(REPLIES))
    args = ["--db", str(db), "eval", "--suite", str(task), "--policy", "scripted", "--script",
            str(script), "--attempts", str(attempts), "--no-reverify", "--json", *extra]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "infra_agent.cli", *args],
                          capture_output=True, text=True, env={**os.environ, **_ENV})  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"eval failed ({' '.join(extra)}): {done.stderr[-1500:]}")
    report = json.loads(done.stdout)
    # Each attempt's run wall time as the machine that ran it read it when the run ended (the
    # driver's copy of a Ray run is last written when it arrives, later).
    inside = sum(a["result"]["wall_s"] for a in report["attempts"] if a["result"])
    finished = sum(1 for a in report["attempts"] if a["status"] == "finished")
    return wall, inside, finished


_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_memory_monitor_refresh_ms": "0"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    os.environ.update(_ENV)
    from ray.cluster_utils import Cluster
    from support import quick_decode_task

    rows: list[tuple[str, float, float, int]] = []
    with tempfile.TemporaryDirectory(prefix="bench-eval-ray-", dir="/tmp") as tmp:
        # Ray's cluster utilities write the head's address to $RAY_TMPDIR/ray (else /tmp/ray,
        # which they do not create)
        os.environ["RAY_TMPDIR"] = tmp
        (Path(tmp) / "ray").mkdir()
        task = quick_decode_task(Path(tmp))
        for slots in args.slots:
            local = Path(tmp) / f"local-{slots}"
            local.mkdir()
            extra = ["--parallel-attempts", str(slots)] if slots > 1 else []
            wall, inside, ok = _eval(local, task, args.attempts, extra)
            rows.append((f"local x{slots}", wall, (wall * slots - inside) / args.attempts, ok))
            print(f"measured {rows[-1]}", file=sys.stderr, flush=True)

            t0 = time.perf_counter()
            head = {"num_cpus": slots, "object_store_memory": 80 << 20, "include_dashboard": False,
                    "temp_dir": str(Path(tmp) / f"r{slots}")}  # fmt: skip
            try:
                cluster = Cluster(initialize_head=True, head_node_args=head)
            except Exception as exc:  # Ray waits a fixed 30 s for a node to register
                if "timed out during startup" not in str(exc):
                    raise
                cluster = Cluster(initialize_head=True, head_node_args=head)
            start = time.perf_counter() - t0
            try:
                ray_dir = Path(tmp) / f"ray-{slots}"
                ray_dir.mkdir()
                extra = ["--executor", "ray", "--address", cluster.address]
                wall, inside, ok = _eval(ray_dir, task, args.attempts, extra)
            finally:
                cluster.shutdown()
            label = f"ray x{slots} (1 node, cluster start {start:.1f}s apart)"
            rows.append((label, wall, (wall * slots - inside) / args.attempts, ok))
            print(f"measured {rows[-1]}", file=sys.stderr, flush=True)

    load = os.getloadavg()[0]
    print(
        f"{args.attempts} attempts of decode-split-norm-quick, 1 experiment each; load {load:.1f}"
    )
    print(f"{'path':44} {'wall s':>8} {'vs local':>9} {'overhead/attempt s':>19}  finished")
    base = {r[0].split()[1]: r[1] for r in rows if r[0].startswith("local")}
    for label, wall, overhead, ok in rows:
        ratio = base[label.split()[1]] / wall
        print(f"{label:44} {wall:8.1f} {ratio:8.2f}x {overhead:19.1f}  {ok}/{args.attempts}")


if __name__ == "__main__":
    main()
