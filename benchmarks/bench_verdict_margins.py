"""How far each verdict the test suite asserts lies from its decision threshold, in units of the
measured noise: the source of the false-failure numbers written next to those tests.

    .venv/bin/python benchmarks/bench_verdict_margins.py [--runs 5] [--busy 2] [CASE ...]

A case is the experiment a test runs (task, patch, parameters) and the verdict it asserts. Per
run it prints the verdict and the per-pair ratios (baseline/candidate for lower-is-better
metrics, > 1 is better); per case, what the test's failure needs and how likely that is:

- IMPROVED asserted: a run surely decides IMPROVED when every pair is better than the threshold
  T = 1 + min_effect (or the test's own bound): then the ratio of medians, every bootstrap
  resample of it and the sign test's interval are above T too. With log pair ratios ~ N(mu, sd)
  pooled over the runs, one run fails with probability at most n * P(pair <= T) (n: pairs).
- NO_CHANGE (or "not IMPROVED") asserted, on a candidate doing the baseline's work: a run can
  only fail if its speedup passes 1 + min_effect (either way, or upwards only): P(log speedup
  beyond ln(1 + min_effect)) with the runs' log speedups ~ N(mu, sd).
- `aa-series`: tests/experiments/test_cascade.py::test_a_a_gives_no_change itself (one arm pair,
  20 decisions): the distribution of its count of decisions that are not NO_CHANGE.

`--busy N` runs N spinning processes beside the experiments (the loaded machine of the suite's
done-when: two busy processes on two cores). Normal-model tails are a model: read the smallest
ratio seen and the load next to them.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import math
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra_agent.experiments import run_experiment
from infra_agent.experiments.verdict import Verdict
from infra_agent.tasks.manifest import Task, load_task
from infra_agent.tasks.patch import Patch, knob_patch, load_patch, parse_diff
from infra_agent.tasks.registry import find_task

TESTS = Path(__file__).resolve().parents[1] / "tests"
Build = Callable[[Path], tuple[Task, Patch, dict[str, Any] | None]]


@dataclass
class Case:
    tests: str
    build: Build | None
    expect: str
    """'improved', 'no-change', 'not-improved' or 'aa-series'."""
    bound: float | None = None
    """The test's own bound on the speedup, when above 1 + min_effect (e.g. 'at least 1.5x')."""


def _adversarial() -> Any:
    path = TESTS / "experiments" / "test_adversarial.py"
    spec = importlib.util.spec_from_file_location("bench_adversarial", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _diff(task: Task, rel: str, new: str) -> Patch:
    old = (task.workspace / rel).read_text()
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")
    return parse_diff("".join(lines))


def _copy(
    source: Path, tmp: Path, budget: dict[str, Any] | None = None, *, whole: bool = False
) -> Task:
    """A copy of a task folder, with `budget` lines replacing the task's own (`whole`: replacing
    its whole [budget] table, as tests/agent/conftest.py's quick_task does)."""
    folder = tmp / source.name
    shutil.copytree(source, folder)
    toml = folder / "task.toml"
    text = toml.read_text()
    if whole:
        text = re.sub(r"\[budget\][^\[]*", "[budget]\n\n", text)
    for key, value in (budget or {}).items():
        text = re.sub(rf"(?m)^{key} = .*$", "", text).replace(
            "[budget]", f"[budget]\n{key} = {value!r}", 1
        )
    toml.write_text(text)
    return load_task(folder)


def bundled(name: str, patch: str, **params: Any) -> Build:
    def build(tmp: Path) -> tuple[Task, Patch, dict[str, Any] | None]:
        task = find_task(name)
        return task, load_patch(task.root / patch), params or None

    return build


def quick_reference(tmp: Path) -> tuple[Task, Patch, dict[str, Any] | None]:
    """tests/agent/conftest.py's quick_task: decode-split-norm, smaller problem and budget."""
    task = _copy(
        find_task("decode-split-norm").root, tmp,
        {"call_timeout_s": 30.0, "min_samples": 5, "max_samples": 12, "measure_budget_s": 3.0,
         "correctness_checks": 1}, whole=True,
    )  # fmt: skip
    return task, load_patch(task.root / "reference.patch"), {"seq_len": 1024, "steps": 2}


def matmul_comment_only(tmp: Path) -> tuple[Task, Patch, dict[str, Any] | None]:
    task = find_task("example-matmul")
    old = (task.workspace / "projection.py").read_text()
    return task, _diff(task, "projection.py", old.replace("# Outer", "# (unchanged) Outer")), None


def pytask_with(source: str) -> Build:
    def build(tmp: Path) -> tuple[Task, Patch, dict[str, Any] | None]:
        task = _copy(TESTS / "experiments" / "pytask", tmp)
        return task, _diff(task, "kernel.py", getattr(_adversarial(), source)), None

    return build


CASES: dict[str, Case] = {
    "matmul-reference": Case(
        "experiments/test_cascade.py::test_reference_fix_improves_consistently_and_is_recorded, "
        "executors/test_executors.py, review/test_web.py (the agent run)",
        bundled("example-matmul", "reference.patch"), "improved"),
    "matmul-aa": Case("experiments/test_cascade.py::test_a_a_on_a_torch_task_gives_no_change",
                      matmul_comment_only, "no-change"),
    "quick-reference": Case(
        "agent/test_scripted_e2e.py, trajectories/test_agent_run_export.py",
        quick_reference, "improved"),
    "split-norm-reference": Case(
        "tasks_suite/test_verdicts.py::test_decode_split_norm_fix_is_at_least_1_5x",
        bundled("decode-split-norm", "reference.patch"), "improved", bound=1.5),
    "split-norm-knobs": Case(
        "tasks_suite/test_verdicts.py::test_decode_split_norm_knob_search_helps_less_than_the_fix",
        lambda tmp: (find_task("decode-split-norm"),
                     knob_patch({"num_splits": 2, "block_size": 1024}), None),
        "improved"),
    "pytask-timers": Case(
        "experiments/test_adversarial.py::test_patched_timers_do_not_change_the_harness_clock",
        pytask_with("PATCH_TIMERS"), "not-improved"),
    "pytask-content-cache": Case(
        "experiments/test_adversarial.py::test_content_hash_cache_never_sees_a_repeated_input",
        pytask_with("CONTENT_CACHE"), "not-improved"),
    "pytask-aa-20": Case("experiments/test_cascade.py::test_a_a_gives_no_change", None,
                         "aa-series"),
}  # fmt: skip


def pair_ratios(perf: Any) -> list[float]:
    pairs = zip(perf.baseline_samples, perf.candidate_samples, strict=False)
    return [c / b if perf.higher_is_better else b / c for b, c in pairs]


def normal_tail(z: float) -> float:
    """P(N(0, 1) > z)."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def _sd(logs: list[float]) -> float:
    return statistics.stdev(logs) if len(logs) > 1 else float("nan")


def run_case(name: str, case: Case, runs: int, backend: str) -> None:
    print(f"\n== {name} [{backend}]: {case.tests}; expects {case.expect}")
    if case.expect == "aa-series":
        aa_series(case, runs, backend)
        return
    verdicts: list[Verdict] = []
    ratios: list[float] = []
    speedups: list[float] = []
    pairs_per_run: list[int] = []
    effect = 0.0
    assert case.build is not None
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            task, patch, params = case.build(Path(tmp))
            effect = task.manifest.min_effect
            started = time.monotonic()
            result = run_experiment(task, patch, sandbox=backend, params=params).result
        perf = result.evidence.performance
        verdicts.append(result.verdict)
        load = open("/proc/loadavg").read().split()[0]
        if perf is None:
            print(f"  run {i + 1}: {result.verdict.value} (no measurement) load {load}")
            continue
        these = pair_ratios(perf)
        ratios += these
        speedups.append(perf.speedup)
        pairs_per_run.append(len(these))
        print(f"  run {i + 1}: {result.verdict.value} {perf.speedup:.3f}x "
              f"[{perf.ci_low:.3f}, {perf.ci_high:.3f}] n={perf.n_samples} pairs "
              f"{min(these):.3f}-{max(these):.3f} ({time.monotonic() - started:.0f} s, "
              f"load {load})")  # fmt: skip
    counts = {v.value: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    print(f"  verdicts {counts}")
    if not ratios:
        return
    if case.expect == "improved":
        threshold = max(1.0 + effect, case.bound or 0.0)
        logs = [math.log(r) for r in ratios]
        mu, sd = statistics.mean(logs), _sd(logs)
        z = (mu - math.log(threshold)) / sd
        n = max(pairs_per_run)
        print(f"  {len(ratios)} pairs: smallest {min(ratios):.3f}x; log ratio mean {mu:.3f} sd "
              f"{sd:.3f}; every pair must beat {threshold:g}x: {z:.1f} sd below the mean; "
              f"P(fail per run) <= {n} x {normal_tail(z):.1e} = {n * normal_tail(z):.1e}")  # fmt: skip
        return
    logs = [math.log(s) for s in speedups]
    mu, sd = statistics.mean(logs), _sd(logs)
    edge = math.log(1.0 + effect)
    up = normal_tail((edge - mu) / sd)
    down = normal_tail((edge + mu) / sd)
    fail = up if case.expect == "not-improved" else up + down
    print(f"  {len(speedups)} runs: speedup {min(speedups):.3f}-{max(speedups):.3f}x; log mean "
          f"{mu:.4f} sd {sd:.4f}; a failure needs a speedup beyond {1 + effect:g}x "
          f"({(edge - abs(mu)) / sd:.1f} sd): P(fail per run) <= {fail:.1e}")  # fmt: skip


def aa_series(case: Case, runs: int, backend: str) -> None:
    """The loop of test_a_a_gives_no_change: one arm pair, 20 decisions, per run."""
    from infra_agent.experiments.arms import ArmSet, SeedSource, load_harness, sandbox_spec
    from infra_agent.experiments.measure import decide, measure
    from infra_agent.sandboxes import create_sandbox

    misses: list[int] = []
    pair_logs: list[float] = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            task = _copy(TESTS / "experiments" / "pytask", Path(tmp),
                         {"min_samples": 6, "max_samples": 10, "measure_budget_s": 1.0})  # fmt: skip
            harness = load_harness(task, task.manifest.params)
            arms = ArmSet(call_timeout_s=10)
            try:
                pair = [
                    arms.open(n, create_sandbox(backend, task.workspace, sandbox_spec(task)), {},
                              task.manifest.params)
                    for n in ("baseline", "candidate")
                ]  # fmt: skip
                for arm in pair:
                    harness.prepare(arm)
                verdicts, speedups = [], []
                for seed in range(20):
                    m = measure(harness, pair[0], pair[1], task.manifest, SeedSource(),
                                deadline=time.monotonic() + 60, bootstrap_seed=seed)  # fmt: skip
                    verdicts.append(decide(m, task.manifest)[0])
                    speedups.append(m.comparison.speedup)
            finally:
                arms.close()
        missed = sum(v != Verdict.NO_CHANGE for v in verdicts)
        misses.append(missed)
        pair_logs.append(statistics.mean(math.log(s) for s in speedups))
        load = open("/proc/loadavg").read().split()[0]
        print(f"  run {i + 1}: {20 - missed}/20 NO_CHANGE; speedups {min(speedups):.3f}-"
              f"{max(speedups):.3f}x (mean of logs {pair_logs[-1]:+.4f}), load {load}")  # fmt: skip
    print(f"  not NO_CHANGE per run of 20: {sorted(misses)}; arm pairs' mean log speedup sd "
          f"{_sd(pair_logs):.4f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"default: all ({', '.join(CASES)})")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside the runs")
    parser.add_argument("--sandbox", default="local")
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)
    ]
    try:
        print(f"{args.busy} busy processes beside the runs; load {open('/proc/loadavg').read()}")
        for name in args.cases or list(CASES):
            run_case(name, CASES[name], args.runs, args.sandbox)
    finally:
        for s in spinners:
            s.kill()
            s.wait()


if __name__ == "__main__":
    main()
