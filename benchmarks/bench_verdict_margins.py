"""How far each verdict the test suite asserts lies from its decision threshold, in units of the
measured noise: the source of the false-failure numbers written next to those tests.

    .venv/bin/python benchmarks/bench_verdict_margins.py [--runs 5] [--busy 2] [CASE ...]

A case is the experiment a test runs (task, patch, parameters) and the verdict it asserts. Per
run it prints the verdict and the per-pair ratios (baseline/candidate for lower-is-better
metrics, > 1 is better); per case, what the test's failure needs and how likely that is:

- IMPROVED asserted: a run's margin is the least of its log margins over decide()'s three
  conditions (speedup > 1 + min_effect, the interval's low end > 1 + min_effect/2, the sign
  test's interval above 1), the test's own bound, and each constraint's (the top of its ratio's
  interval below the allowed ratio): a run fails when it is negative. With the
  runs' margins ~ N(mu, sd), P(fail per run) ~ P(N(0, 1) > mu / sd).
- NO_CHANGE (or "not IMPROVED") asserted, on a candidate doing the baseline's work: a run can
  only fail if its speedup passes 1 + min_effect (either way, or upwards only): P(log speedup
  beyond ln(1 + min_effect)) with the runs' log speedups ~ N(mu, sd).
- `aa-series`: tests/experiments/test_cascade.py::test_a_a_gives_no_change itself (20 decisions,
  each on a new arm pair; also on one pair, as it was before): the distribution of its count of
  decisions that are not NO_CHANGE, with an exact upper bound on their rate.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra_agent.experiments import rules, run_experiment
from infra_agent.judgement.intervals import sign_interval
from infra_agent.store.verdict import Verdict
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
    static_rules: bool = True
    """False: the test turns the static rules off (`no_static_rules`)."""


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


def pytask_with(source: str, allow: list[str] | None = None) -> Build:
    """tests/experiments/conftest.py's pytask (`allow`: rule groups it allows) and a kernel from
    tests/experiments/test_adversarial.py."""

    def build(tmp: Path) -> tuple[Task, Patch, dict[str, Any] | None]:
        task = _copy(TESTS / "experiments" / "pytask", tmp)
        if allow:
            toml = task.root / "task.toml"
            toml.write_text(toml.read_text().replace(
                "min_effect = 0.05", f"min_effect = 0.05\nallow = {allow!r}".replace("'", '"')
            ))  # fmt: skip
            task = load_task(task.root)
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
    "pd-kv-reference": Case(
        "tasks_suite/test_verdicts.py::test_pd_kv_reuse_race_fix_has_zero_corruptions",
        bundled("pd-kv-reuse-race", "reference.patch"), "improved"),
    "kv-gil-reference": Case(
        "tasks_suite/test_verdicts.py::test_kv_transfer_gil_fix_removes_the_overhead",
        bundled("kv-transfer-gil", "reference.patch"), "improved"),
    "kv-gil-wrong": Case(
        "tasks_suite/test_verdicts.py::test_kv_transfer_gil_switch_interval_does_not_help",
        bundled("kv-transfer-gil", "wrong_fix.patch"), "not-improved"),
    "tiered-reference": Case(
        "tasks_suite/test_verdicts.py::test_tiered_cache_fix_has_zero_reads_before_ready_and_"
        "keeps_overlap",
        bundled("tiered-cache-load-order", "reference.patch"), "improved"),
    "pytask-timers": Case(
        "experiments/test_adversarial.py::test_patched_timers_do_not_change_the_harness_clock",
        pytask_with("PATCH_TIMERS"), "not-improved", static_rules=False),
    "pytask-content-cache": Case(
        "experiments/test_adversarial.py::test_content_hash_cache_never_sees_a_repeated_input",
        pytask_with("CONTENT_CACHE", allow=["state"]), "not-improved"),
    "pytask-fast": Case(
        "experiments/test_adversarial.py::test_hang_and_runaway_allocation_fail_and_the_next_"
        "experiment_runs (the honest run), experiments/test_cascade.py::test_cli_json_and_store",
        pytask_with("FAST"), "improved"),
    "pytask-aa-20": Case("experiments/test_cascade.py::test_a_a_gives_no_change", None,
                         "aa-series"),
}  # fmt: skip


def pair_ratios(perf: Any) -> list[float]:
    pairs = zip(perf.baseline_samples, perf.candidate_samples, strict=False)
    return [c / b if perf.higher_is_better else b / c for b, c in pairs]


def normal_tail(z: float) -> float:
    """P(N(0, 1) > z)."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def improved_margin(
    perf: Any, effect: float, bound: float | None, constraints: list[float]
) -> float:
    """How far (log scale) a measurement is from losing IMPROVED: the least of its margins over
    decide()'s three conditions (speedup > 1 + e, CI low > 1 + e/2, the sign test's interval
    above 1), the test's own bound on the speedup and the `constraints` (each the log of its
    allowed ratio over the top of its interval). Negative: not IMPROVED."""
    margins = constraints + [
        math.log(perf.speedup / (1.0 + effect)),
        math.log(perf.ci_low / (1.0 + effect / 2)),
    ]
    sign = sign_interval(pair_ratios(perf))
    if sign is not None:
        margins.append(math.log(sign[0]))
    if bound is not None:
        margins.append(math.log(perf.speedup / bound))
    return min(margins)


def run_case(name: str, case: Case, runs: int, backend: str) -> None:
    print(f"\n== {name} [{backend}]: {case.tests}; expects {case.expect}")
    if case.expect == "aa-series":
        aa_series(runs, backend, fresh=False)
        aa_series(runs, backend, fresh=True)
        return
    assert case.build is not None
    verdicts: list[Verdict] = []
    margins: list[float] = []
    speedups: list[float] = []
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp, _static_rules(case.static_rules):
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
        rate = task.manifest.metric.events is not None  # zero counts: no per-pair ratios
        these = [] if rate else pair_ratios(perf)
        speedups.append(perf.speedup)
        limits = {
            f"{c.metric} <= {c.max_ratio:g}": math.log(c.max_ratio / result.evidence.metrics[high])
            for c in task.manifest.constraints
            if (high := f"{c.metric}_ratio_high") in result.evidence.metrics
        }
        if rate:  # its decision is exact on pooled counts; what a run can miss is a constraint
            margins.append(min(limits.values(), default=math.inf))
        else:
            margins.append(improved_margin(perf, effect, case.bound, list(limits.values())))
        shown = "".join(f", {name}: margin {m:+.3f}" for name, m in limits.items())
        print(f"  run {i + 1}: {result.verdict.value} {perf.speedup:.3f}x "
              f"[{perf.ci_low:.3f}, {perf.ci_high:.3f}] n={perf.n_samples}"
              f"{f' pairs {min(these):.3f}-{max(these):.3f}' if these else ''}, "
              f"margin {margins[-1]:+.3f}{shown} "
              f"({time.monotonic() - started:.0f} s, load {load})")  # fmt: skip
    counts = {v.value: verdicts.count(v) for v in dict.fromkeys(verdicts)}
    print(f"  verdicts {counts}")
    if len(speedups) < 2:
        return
    if case.expect == "improved":
        mu, sd = statistics.mean(margins), _sd(margins)
        print(f"  margin to losing IMPROVED (log): smallest {min(margins):+.3f}, mean {mu:.3f} "
              f"sd {sd:.3f}: {mu / sd:.1f} sd; P(fail per run) ~ {normal_tail(mu / sd):.1e}")  # fmt: skip
        return
    logs = [math.log(s) for s in speedups]
    mu, sd = statistics.mean(logs), _sd(logs)
    edge = math.log(1.0 + effect)
    up = normal_tail((edge - mu) / sd)
    fail = up if case.expect == "not-improved" else up + normal_tail((edge + mu) / sd)
    print(f"  {len(speedups)} runs: speedup {min(speedups):.3f}-{max(speedups):.3f}x; log mean "
          f"{mu:+.4f} sd {sd:.4f}; a failure needs a speedup beyond {1 + effect:g}x "
          f"({(edge - abs(mu)) / sd:.1f} sd): P(fail per run) <= {fail:.1e}")  # fmt: skip


@contextmanager
def _static_rules(on: bool) -> Iterator[None]:
    """Static rules off (tests' `no_static_rules`): the candidate reaches the run-time checks."""
    if on:
        yield
        return
    saved = rules.new_violations
    rules.new_violations = lambda *args, **kwargs: []  # type: ignore[assignment]
    try:
        yield
    finally:
        rules.new_violations = saved


def aa_series(runs: int, backend: str, *, fresh: bool) -> None:
    """The loop of test_a_a_gives_no_change, 20 decisions per run: on one arm pair, or (`fresh`)
    on a new pair for each decision (independent decisions)."""
    from infra_agent.experiments.arms import ArmSet, SeedSource, load_harness, sandbox_spec
    from infra_agent.experiments.measure import decide, measure
    from infra_agent.sandboxes import create_sandbox

    print(f"  {'a new arm pair per decision' if fresh else 'one arm pair per run'}:")
    misses: list[int] = []
    for i in range(runs):
        verdicts, speedups = [], []
        with tempfile.TemporaryDirectory() as tmp:
            task = _copy(TESTS / "experiments" / "pytask", Path(tmp),
                         {"min_samples": 6, "max_samples": 10, "measure_budget_s": 1.0})  # fmt: skip
            harness = load_harness(task, task.manifest.params)
            arms: ArmSet | None = None
            try:
                for seed in range(20):
                    if arms is None or fresh:
                        if arms is not None:
                            arms.close()
                        arms = ArmSet(call_timeout_s=10)
                        pair = [
                            arms.open(n, create_sandbox(backend, task.workspace,
                                                        sandbox_spec(task)), {}, task.manifest.params)
                            for n in ("baseline", "candidate")
                        ]  # fmt: skip
                        for arm in pair:
                            harness.prepare(arm)
                    m = measure(harness, pair[0], pair[1], task.manifest, SeedSource(),
                                deadline=time.monotonic() + 60, bootstrap_seed=seed)  # fmt: skip
                    verdicts.append(decide(m, task.manifest)[0])
                    speedups.append(m.comparison.speedup)
            finally:
                if arms is not None:
                    arms.close()
        misses.append(sum(v != Verdict.NO_CHANGE for v in verdicts))
        load = open("/proc/loadavg").read().split()[0]
        print(f"  run {i + 1}: {20 - misses[-1]}/20 NO_CHANGE; speedups {min(speedups):.3f}-"
              f"{max(speedups):.3f}x, load {load}")  # fmt: skip
    total = 20 * len(misses)
    print(f"  not NO_CHANGE per run of 20: {sorted(misses)}; {sum(misses)} of {total} decisions "
          f"(95% upper bound {clopper_pearson_upper(sum(misses), total):.3f})")  # fmt: skip


def clopper_pearson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """One-sided exact upper confidence bound of a binomial proportion after k of n."""
    lo, hi = k / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        tail = sum(math.comb(n, i) * mid**i * (1 - mid) ** (n - i) for i in range(k + 1))
        lo, hi = (mid, hi) if tail > 1 - confidence else (lo, mid)
    return hi


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
