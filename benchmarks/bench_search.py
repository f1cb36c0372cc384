"""The search policy against random search and the task's default configuration, same budget.

    .venv/bin/python benchmarks/bench_search.py [--task decode-split-norm] [--budget 6] [--quick]

For each strategy (Optuna TPE seeded by the skeletons, random search over the same value
lists) a full agent run with `--budget` experiments; plus one A/A experiment of the default
configuration (what "doing nothing" measures as). Prints per strategy: the best proven speedup
(IMPROVED, CI excluding 1), the experiments needed to reach 90% of it, the verdict mix, and wall
time. All strategies run in one invocation, one after the other, on the same machine; `--quick`
uses a copy of the task with a smaller measurement budget (the same code and harness).
"""

from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.runner import start_run
from infra_agent.agent.state import Budget, ExperimentOutcome
from infra_agent.config import load_settings
from infra_agent.experiments import run_experiment
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.patch import knob_patch
from infra_agent.tasks.registry import find_task


def quick_copy(name: str, folder: Path) -> Path:
    target = folder / f"{name}-quick"
    shutil.copytree(find_task(name).root, target)
    toml = target / "task.toml"
    text = toml.read_text().replace(f'name = "{name}"', f'name = "{name}-quick"')
    text = re.sub(
        r"\[budget\][^\[]*",
        "[budget]\ncall_timeout_s = 30.0\nmin_samples = 5\nmax_samples = 12\n"
        "measure_budget_s = 3.0\ncorrectness_checks = 1\n\n",
        text,
    )
    toml.write_text(text)
    return target


def reach(experiments: list[ExperimentOutcome]) -> tuple[float, int | None]:
    """(best proven speedup, experiments needed to reach 90% of it)."""
    wins = [
        (i, e.speedup or 1.0) for i, e in enumerate(experiments, 1) if e.verdict is Verdict.IMPROVED
    ]
    if not wins:
        return 1.0, None
    best = max(s for _, s in wins)
    return best, next(i for i, s in wins if s >= 0.9 * best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="decode-split-norm")
    parser.add_argument("--budget", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="smaller measurement budget")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        task_ref = str(quick_copy(args.task, Path(tmp))) if args.quick else args.task
        settings = load_settings(overrides={"store.db": str(Path(tmp) / "runs.db")})
        rows = []
        for strategy in ("tpe", "random"):
            config = RunConfig(
                task=task_ref, policy="search", search_strategy=strategy,  # type: ignore[arg-type]
                budget=Budget(experiments=args.budget), seed=7,
            )  # fmt: skip
            t0 = time.perf_counter()
            outcome = start_run(config, settings)
            wall = time.perf_counter() - t0
            best, needed = reach(outcome.experiments)
            verdicts = Counter(e.verdict.value for e in outcome.experiments)
            rows.append((strategy, best, needed, dict(verdicts), wall, outcome.best))
            print(
                f"done: {strategy} best {best:.3f}x to-90% {needed} {dict(verdicts)} {wall:.0f} s",
                flush=True,
            )
        t0 = time.perf_counter()
        task = find_task(task_ref)
        name, knob = next(iter(task.manifest.knobs.items()))
        aa = run_experiment(task, knob_patch({name: knob.default}, author="bench"), seed=0)  # A/A
        perf = aa.result.evidence.performance
        aa_text = f"{perf.speedup:.3f}x [{perf.ci_low:.3f}, {perf.ci_high:.3f}]" if perf else "-"
        default_row = (
            "default config (A/A)",
            aa.result.verdict.value,
            aa_text,
            time.perf_counter() - t0,
        )
    print(
        f"task {args.task}{' (quick)' if args.quick else ''}, budget {args.budget} experiments per strategy"
    )
    print(f"{'strategy':<22}{'best proven':>12}{'to 90%':>8}  verdicts{'':<30}{'wall s':>8}")
    for strategy, best, needed, verdicts, wall, winner in rows:
        where = f"  ({winner.patch_summary})" if winner else ""
        print(
            f"{strategy:<22}{best:>11.3f}x{needed or '-':>8}  {str(verdicts):<38}{wall:>8.0f}{where}"
        )
    label, verdict, text, wall = default_row
    print(f"{label:<22}{'1.000x':>12}{'-':>8}  {verdict} {text:<27}{wall:>8.0f}")
    coord, rand = rows[0][1], rows[1][1]
    print(f"ratio best speedup tpe / random: {coord / rand:.3f}")


if __name__ == "__main__":
    main()
