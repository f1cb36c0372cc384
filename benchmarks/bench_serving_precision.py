"""Benchmark: how small a change a serving experiment can see on this machine, before and after.

Runs full experiments through the verification cascade on sglang-cpu-tiny at its default budget,
in two settings side by side (alternating, so both see the same machine):

- before: the serving measurement as it was before issue 22 (both arms' servers running all the
  time, no warm-up after a switch of arms, the workload and budget of that time);
- after: the task and harness as they are now.

For each setting it runs `--runs` A/A experiments (baseline against an unchanged knob: every
difference is noise) and `--runs` experiments of a moderate effect whose true size was
established by long runs (`--effect`, measured with `--calibrate`), and prints: the A/A 95%
interval (median and widest half-width, verdicts), the effect's detection rate (IMPROVED of
runs) and speedups, the detectable effect each experiment stated, the companion metric (output
tokens per server CPU-second), and the minutes an experiment took. The machine's load average is
printed before and after; `--busy N` adds N `yes > /dev/null` processes (load N and more).

A series can be split across jobs: `--out FILE` appends every experiment as a JSON line and
reads what is there first, so `--runs` is the series' size: a later job runs only the experiments
still missing (a job stopped by SIGTERM or Ctrl-C loses only the one in progress); `--report
FILE` only prints the table. `--calibrate N` instead runs one experiment of the effect with N
samples per arm (and no early stop) to establish its true size. Prints numbers only; it asserts
nothing. Nothing else heavy should share the machine: it measures whatever shares the cores.

    .venv/bin/python benchmarks/bench_serving_precision.py --runs 3
    .venv/bin/python benchmarks/bench_serving_precision.py --runs 10 --settings after --busy 2 --out aa.jsonl --kinds aa
    .venv/bin/python benchmarks/bench_serving_precision.py --calibrate 40
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import tomllib

from infra_agent.experiments import run_experiment
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.manifest import Task, load_task
from infra_agent.tasks.patch import knob_patch
from infra_agent.tasks.registry import find_task

EFFECT = {"max-running-requests": 6}
"""The moderate effect's default knobs (--effect): 6 requests decoded together instead of 4.
Established here (2026-12-03, load <= 1, 32 requests a sample) with `--calibrate 40`: 1.164x
(95% CI 1.142-1.180); `max-running-requests` 5 measured 1.096x (1.079-1.110) with 60 pairs."""
SETTINGS: dict[str, dict[str, dict[str, Any]]] = {
    "before": {
        "params": {"pause_idle_arm": False, "warmup_prompts": 0, "num_prompts": 128},
        "budget": {"min_samples": 6, "max_samples": 12, "measure_budget_s": 180.0},
    },
    "after": {"params": {}, "budget": {}},
}
"""Overrides of the bundled task's [params] and [budget] per setting."""


def task_copy(base: Task, setting: str, folder: Path, budget: dict[str, Any] | None = None) -> Task:
    """The bundled task with the setting's params and budget written into its task.toml."""
    dest = folder / setting
    if not dest.exists():
        shutil.copytree(base.root, dest)
    data = tomllib.loads((base.root / "task.toml").read_text())
    params = {**data.get("params", {}), **SETTINGS[setting]["params"]}
    limits = {**data.get("budget", {}), **SETTINGS[setting]["budget"], **(budget or {})}
    text = (base.root / "task.toml").read_text()
    head = text[: text.index("[params]")]
    lines = [head, "[params]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in params.items()]
    lines += ["", "[budget]"] + [f"{k} = {json.dumps(v)}" for k, v in limits.items()]
    (dest / "task.toml").write_text("\n".join(lines) + "\n")
    return load_task(dest)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def one(task: Task, kind: str, setting: str, seed: int, effect: dict[str, Any]) -> dict[str, Any]:
    knobs = effect if kind == "effect" else {"stream-interval": 1}
    started_load = load()
    record = run_experiment(task, knob_patch(knobs, author="bench"), seed=seed)
    r, perf = record.result, record.result.evidence.performance
    row: dict[str, Any] = {
        "setting": setting, "kind": kind, "knobs": knobs, "verdict": r.verdict.value, "flags": [f.value for f in r.flags],
        "minutes": record.duration_s / 60, "load_start": started_load, "load_end": load(),
        "stages_s": r.evidence.durations_s,
    }  # fmt: skip
    if perf is not None:
        m = r.evidence.metrics
        row.update(
            speedup=perf.speedup, ci_low=perf.ci_low, ci_high=perf.ci_high, n=perf.n_samples,
            detectable=perf.detectable_effect, pair_noise=perf.pair_noise,
            companion=m.get("output_tokens_per_cpu_s_speedup"),
            companion_low=m.get("output_tokens_per_cpu_s_ci_low"),
            companion_high=m.get("output_tokens_per_cpu_s_ci_high"),
        )  # fmt: skip
    else:
        row["reasons"] = r.reasons[:2]
    return row


def table(rows: list[dict[str, Any]]) -> str:
    out = [f"{'setting':<7} {'kind':<6} {'runs':>4}  {'verdicts':<34} {'CI half-width med/max':<22} "
           f"{'speedup med [min-max]':<24} {'detects':<8} {'tok/CPU-s':<9} {'minutes':<8}"]  # fmt: skip
    for setting in SETTINGS:
        for kind in ("aa", "effect"):
            group = [r for r in rows if r["setting"] == setting and r["kind"] == kind]
            if not group:
                continue
            verdicts = {
                v: sum(r["verdict"] == v for r in group) for v in {r["verdict"] for r in group}
            }
            measured = [r for r in group if "speedup" in r]
            half = [
                max(r["speedup"] - r["ci_low"], r["ci_high"] - r["speedup"]) / r["speedup"]
                for r in measured
            ]
            sp = [r["speedup"] for r in measured]
            det = [r["detectable"] for r in measured if r.get("detectable")]
            comp = [r["companion"] for r in measured if r.get("companion")]
            out.append(
                f"{setting:<7} {kind:<6} {len(group):>4}  {json.dumps(verdicts):<34} "
                + (f"±{statistics.median(half):.1%} / ±{max(half):.1%}".ljust(22) if half else " " * 22)
                + (f" {statistics.median(sp):.3f} [{min(sp):.3f}-{max(sp):.3f}]".ljust(25) if sp else " " * 25)
                + (f"{statistics.median(det):.3f}".ljust(9) if det else " " * 9)
                + (f"{statistics.median(comp):.3f}".ljust(10) if comp else " " * 10)
                + f"{statistics.median(r['minutes'] for r in group):.1f} (max {max(r['minutes'] for r in group):.1f})"
            )  # fmt: skip
            inside = sum(0.9 <= r["ci_low"] and r["ci_high"] <= 1.1 for r in measured)
            loads = [float(r[k].split()[0]) for r in group for k in ("load_start", "load_end")]
            stages = (
                {
                    k: statistics.median(
                        r["stages_s"].get(k, 0.0) for r in group if "stages_s" in r
                    )
                    for k in ("prepare", "performance", "health")
                }
                if any("stages_s" in r for r in group)
                else {}
            )
            out.append(
                f"{'':<19} interval within [0.9, 1.1]: {inside}/{len(measured)}; samples/arm median "
                f"{statistics.median(r['n'] for r in measured) if measured else 0:.0f}; 1-min load "
                f"{min(loads):.1f}-{max(loads):.1f}; median stage s "
                + ", ".join(f"{k} {v:.0f}" for k, v in stages.items())
            )  # fmt: skip
    detection = {
        s: sum(r["verdict"] == Verdict.IMPROVED.value for r in rows if r["setting"] == s and r["kind"] == "effect")
        for s in SETTINGS
    }  # fmt: skip
    runs = {s: sum(r["setting"] == s and r["kind"] == "effect" for r in rows) for s in SETTINGS}
    out.append(
        "effect detected (IMPROVED): "
        + ", ".join(f"{s} {detection[s]}/{runs[s]}" for s in SETTINGS if runs[s])
    )
    return "\n".join(out)


def calibrate(base: Task, pairs: int, folder: Path, effect: dict[str, Any]) -> None:
    task = task_copy(base, "after", folder,
                     budget={"min_samples": pairs, "max_samples": pairs, "measure_budget_s": 36000.0,
                             "experiment_timeout_s": 36000.0})  # fmt: skip
    print(f"load before: {load()}", flush=True)
    record = run_experiment(task, knob_patch(effect, author="bench"), seed=0)
    print(record.result.render())
    print(f"took {record.duration_s / 60:.1f} min; load after: {load()}")


def _count(rows: list[dict[str, Any]], setting: str, kind: str) -> int:
    return sum(r["setting"] == setting and r["kind"] == kind for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", type=int, default=3, help="experiments per setting and kind, --out's included"
    )
    parser.add_argument("--settings", default="before,after")
    parser.add_argument("--kinds", default="aa,effect")
    parser.add_argument("--busy", type=int, default=0, help="`yes > /dev/null` processes to add")
    parser.add_argument("--out", type=Path, help="append experiments here (JSON lines)")
    parser.add_argument("--report", type=Path, help="print the table of a series and exit")
    parser.add_argument(
        "--calibrate", type=int, metavar="PAIRS", help="establish the effect's size"
    )
    parser.add_argument(
        "--effect", type=json.loads, default=EFFECT, metavar="JSON",
        help=f"knobs of the moderate effect (default {json.dumps(EFFECT)})",
    )  # fmt: skip
    args = parser.parse_args()
    if args.report:
        print(table([json.loads(line) for line in args.report.read_text().splitlines() if line]))
        return
    base = find_task("sglang-cpu-tiny")
    folder = Path(tempfile.mkdtemp(prefix="bench-precision-"))
    # SIGTERM unwinds like Ctrl-C: the busy processes and the folder go (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.busy)]
    try:
        if args.calibrate:
            calibrate(base, args.calibrate, folder, args.effect)
            return
        rows = []
        if args.out and args.out.exists():
            rows = [json.loads(line) for line in args.out.read_text().splitlines() if line]
        print(f"load before: {load()} (busy processes added: {args.busy})", flush=True)
        tasks = {s: task_copy(base, s, folder) for s in args.settings.split(",")}
        for _ in range(args.runs):
            for kind in args.kinds.split(","):
                for setting, task in tasks.items():
                    if _count(rows, setting, kind) >= args.runs:
                        continue  # this part of the series is complete (in --out)
                    row = one(task, kind, setting, seed=len(rows), effect=args.effect)
                    row["busy"] = args.busy
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.out:
                        with args.out.open("a") as f:
                            f.write(json.dumps(row) + "\n")
        print(f"load after: {load()}")
        print(table(rows))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
