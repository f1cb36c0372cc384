"""Benchmark: how much longer a serving experiment takes with the serving judge (issue 33) than
with the code before it, both run side by side on this machine.

`--old` is a checkout of the code before the judge work (by default commit 9fdaab7, made with
`git clone <repo> /tmp/h33/old/infra_agent && git -C /tmp/h33/old/infra_agent checkout
9fdaab7`); the new code is this checkout. Each experiment runs `infra-agent experiment --json`
in a child process whose PYTHONPATH puts the chosen code first (the child prints which package
it imported, and a mismatch stops the benchmark), each code with a fresh INFRA_AGENT_HOME of its
own (its own run store). The cases run in turns, old then new, round after round, so both see
the same machine; every experiment is appended to `--out` as one JSON line (a later run reads
what is there and runs only what is missing; `--report` only prints the table).

Cases (the same patch file for both codes):
- `slow-decode-ref`: sglang-slow-decode with its reference.patch (IMPROVED expected);
- `cpu-tiny-aa`: sglang-cpu-tiny with a knob patch setting a knob to its default (an A/A
  experiment: NO_CHANGE expected).

Prints per case the median wall time of each code, the ratio new/old, the median of each cascade
stage, and every experiment's verdict, ratio and 95% interval, with the load average around it.
Asserts nothing; nothing else heavy should share the machine.

    .venv/bin/python benchmarks/bench_judge_overhead.py --rounds 2 --out /tmp/h33/overhead.jsonl
    .venv/bin/python benchmarks/bench_judge_overhead.py --report /tmp/h33/overhead.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import infra_agent

NEW = Path(infra_agent.__file__).resolve().parent
TASKS = NEW / "bundled_tasks"
CASES: dict[str, tuple[str, str]] = {
    "slow-decode-ref": (
        "sglang-slow-decode",
        str(TASKS / "sglang-slow-decode" / "reference.patch"),
    ),
    "cpu-tiny-aa": ("sglang-cpu-tiny", "aa"),
}
AA_KNOBS = "[knobs]\nchunked-prefill-size = 64  # the default: an A/A experiment\n"
CHILD = (
    "import sys, infra_agent; print('PACKAGE', infra_agent.__file__, file=sys.stderr, flush=True); "
    "from infra_agent.cli import main; sys.argv = ['infra-agent', *sys.argv[1:]]; main()"
)


def run_one(code: str, root: Path, case: str, homes: Path, patches: Path) -> dict[str, Any]:
    """One experiment of `case` with the code at `root` (the package folder), timed."""
    task, patch = CASES[case]
    if patch == "aa":
        patch = str(patches / "aa.toml")
    env = {**os.environ, "PYTHONPATH": str(root.parent), "INFRA_AGENT_HOME": str(homes / code)}
    argv = [sys.executable, "-c", CHILD, "experiment", "--task", task, "--patch", patch, "--json"]
    load = os.getloadavg()[0]
    started = time.monotonic()
    child = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    try:
        out, err = child.communicate()
    except BaseException:
        os.killpg(child.pid, signal.SIGTERM)  # the CLI stops its servers on SIGTERM
        child.wait()
        raise
    wall = time.monotonic() - started
    imported = next((ln.split()[1] for ln in err.splitlines() if ln.startswith("PACKAGE ")), "")
    if Path(imported).resolve().parent != root:
        sys.exit(f"{code}: the child imported {imported or 'nothing'}, not {root}")
    row: dict[str, Any] = {
        "code": code, "case": case, "wall_s": round(wall, 1), "rc": child.returncode,
        "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2),
    }  # fmt: skip
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        row["error"] = (err.strip().splitlines() or ["no output"])[-1]
        return row
    perf = report.get("performance") or {}
    row |= {
        "verdict": report["verdict"],
        "speedup": perf.get("speedup"),
        "ci": [perf.get("ci_low"), perf.get("ci_high")],
        "n": perf.get("n_samples"),
        "durations_s": report.get("durations_s", {}),
        "experiment_id": report["experiment_id"],
    }
    return row


def report(rows: list[dict[str, Any]]) -> None:
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        if not mine:
            continue
        print(f"\n{case}:")
        med: dict[str, float] = {}
        for code in ("old", "new"):
            walls = [r["wall_s"] for r in mine if r["code"] == code]
            if walls:
                med[code] = statistics.median(walls)
                stages = sorted(
                    {s for r in mine if r["code"] == code for s in r.get("durations_s", {})}
                )
                per = {
                    s: statistics.median(r.get("durations_s", {}).get(s, 0.0) for r in mine if r["code"] == code)
                    for s in stages
                }  # fmt: skip
                print(f"  {code}: median wall {med[code]:.0f} s of {len(walls)}; stages (median s): "
                      + ", ".join(f"{s} {v:.0f}" for s, v in per.items()))  # fmt: skip
        if len(med) == 2:
            print(f"  new/old wall: {med['new'] / med['old']:.2f}x")
        for r in mine:
            ci = r.get("ci") or [None, None]
            num = (
                f"{r['speedup']:.3f}x (95% CI {ci[0]:.3f}-{ci[1]:.3f}), n={r['n']}"
                if r.get("speedup") is not None
                else r.get("error", "")
            )
            print(f"  - {r['code']}: {r.get('verdict', 'ERROR')} {num}; {r['wall_s']:.0f} s; "
                  f"load {r['load_before']}->{r['load_after']}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, default=Path("/tmp/h33/old/infra_agent"))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=2, help="Experiments per case and code.")
    parser.add_argument("--out", type=Path, default=None, help="Append each experiment here.")
    parser.add_argument("--report", type=Path, default=None, help="Only print this file's table.")
    args = parser.parse_args()
    if args.report is not None:
        report([json.loads(ln) for ln in args.report.read_text().splitlines() if ln.strip()])
        return
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not (args.old / "__init__.py").is_file():
        sys.exit(f"unknown case {unknown[0]}" if unknown else f"--old {args.old}: not a checkout")
    rows: list[dict[str, Any]] = []
    if args.out is not None and args.out.exists():
        rows = [json.loads(ln) for ln in args.out.read_text().splitlines() if ln.strip()]
    codes = {"old": args.old.resolve(), "new": NEW}
    with tempfile.TemporaryDirectory(prefix="judge-overhead-") as tmp:
        (Path(tmp) / "aa.toml").write_text(AA_KNOBS)
        for _ in range(args.rounds):
            for case in cases:
                for code, root in codes.items():
                    done = sum(r["case"] == case and r["code"] == code for r in rows)
                    if done >= args.rounds:
                        continue
                    print(f"{case} {code} ...", flush=True)
                    row = run_one(code, root, case, Path(tmp) / "homes", Path(tmp))
                    rows.append(row)
                    print(f"  {json.dumps(row)}", flush=True)
                    if args.out is not None:
                        with args.out.open("a") as fh:
                            fh.write(json.dumps(row) + "\n")
    report(rows)


if __name__ == "__main__":
    main()
