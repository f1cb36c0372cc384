"""Record every sample of one real experiment, in measurement order, for the tests that replay
them through the statistics (tests/recorded_samples.py): the verdict a test asserts then
depends on these recorded samples, not on the load of the machine running the suite.

    .venv/bin/python benchmarks/record_samples.py CASE [CASE ...]

A case is one of benchmarks/bench_verdict_margins.py's (the experiment a test ran for real) or
one of CASES below.
Each writes tests/experiments/data/<case>.json: {"what": ..., "baseline": {key: [...]},
"candidate": {key: [...]}}, every key the harness returned. The time budget is lifted while
recording, so sampling stops where the statistics say (resolved) or at max_samples, as a
replay (which takes no time) does; the file says the verdict, speedup, date and load.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_verdict_margins import CASES as MARGIN_CASES  # benchmarks/ is this script's folder
from bench_verdict_margins import Case, bundled

from infra_agent.experiments import measure as measure_module
from infra_agent.experiments import run_experiment
from infra_agent.tasks.harness import Arm, Harness
from infra_agent.tasks.manifest import TaskManifest

DATA = Path(__file__).resolve().parents[1] / "tests" / "experiments" / "data"
T = "tasks_suite/test_verdicts.py::"
CASES: dict[str, Case] = MARGIN_CASES | {
    "chunked-reference": Case(
        T + "test_chunked_state_precision_fix_meets_threshold",
        bundled("chunked-state-precision", "reference.patch"), "improved"),
    "moe-reference": Case(
        T + "test_batch_invariant_moe_fix_reaches_the_float32_floor",
        bundled("batch-invariant-moe", "reference.patch"), "improved"),
    "tiered-wrong": Case(
        T + "test_tiered_cache_loading_everything_first_loses_the_overlap",
        bundled("tiered-cache-load-order", "wrong_fix.patch"), "not-improved"),
}  # fmt: skip
"""bench_verdict_margins.py's cases and three more whose tests replay a recording."""


def record(name: str) -> Path:
    """Run case `name` once, recording each sample `measure` takes; write and return its file."""
    case = CASES[name]
    assert case.build is not None, f"{name} is not one experiment"
    taken: dict[str, dict[str, list[float]]] = {"baseline": {}, "candidate": {}}
    original = measure_module._take

    def take(harness: Harness, arm: Arm, seed: int, manifest: TaskManifest) -> dict[str, float]:
        sample = original(harness, arm, seed, manifest)
        for key, value in sample.items():
            taken[arm.name].setdefault(key, []).append(value)
        return sample

    load = open("/proc/loadavg").read().split()[0]
    with tempfile.TemporaryDirectory() as tmp:
        task, patch, params = case.build(Path(tmp))
        task.manifest.budget.measure_budget_s = 1e6  # stop as a replay does (no time passes)
        measure_module._take = take  # type: ignore[assignment]
        try:
            result = run_experiment(task, patch, params=params).result
        finally:
            measure_module._take = original  # type: ignore[assignment]
    perf = result.evidence.performance
    gain = f"{perf.speedup:.3f}x (95% CI {perf.ci_low:.3f}-{perf.ci_high:.3f})" if perf else "-"
    what = (
        f"{name} ({case.tests}): every sample of one experiment, in measurement order, as the "
        f"harness returned them ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, a 2-core "
        f"machine at load {load}; time budget lifted; verdict {result.verdict.value} {gain}; "
        f"params {params}; benchmarks/record_samples.py)"
    )
    out = DATA / f"{name}.json"
    body: dict[str, Any] = {"what": what, **taken}
    out.write_text(json.dumps(body, indent=0) + "\n")
    print(what)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help=", ".join(CASES))
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in CASES or CASES[c].build is None]
    if unknown:
        parser.error(f"unknown or not one experiment: {', '.join(unknown)}")
    for name in args.cases:
        record(name)


if __name__ == "__main__":
    main()
