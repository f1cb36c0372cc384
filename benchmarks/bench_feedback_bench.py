"""The microbenchmark runner next to torch.utils.benchmark and pyperf, on the same callables.

    .venv/bin/python benchmarks/bench_feedback_bench.py [--quick] [--clock cpu|wall]

Workload: a pure-Python loop `work(n)`, whose time is linear in n, so `work(1.05 n)` is a known
5% slower variant. Prints, in one run on the same machine:
1. time to a result on an A/A pair and on a 5% effect for: our runner (verdict with CI),
   torch.utils.benchmark blocked_autorange / adaptive_autorange (two measurements, ratio of
   medians, no verdict), and pyperf timeit + compare_to (if pyperf is installed);
2. our A/A false-positive rate (FASTER or SLOWER on identical code) over many trials;
3. our detection rate of a 3% and a 5% effect.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from pathlib import Path

from infra_agent.feedback.bench import run_bench

N = 20_000


def work(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def ours(effect: float, clock: str, budget_s: float) -> tuple[str, float, float]:
    start = time.perf_counter()
    r = run_bench(
        lambda: work(N),
        lambda: work(int(N * (1 + effect))),
        clock=clock,
        budget_s=budget_s,
        min_sample_s=0.01,
    )
    return r.comparison.verdict, r.comparison.speedup, time.perf_counter() - start


def torch_timer(effect: float, adaptive: bool) -> tuple[str, float, float]:
    from torch.utils.benchmark import Timer

    start = time.perf_counter()
    medians = []
    for n in (N, int(N * (1 + effect))):
        timer = Timer(stmt=f"work({n})", globals={"work": work})
        m = (
            timer.adaptive_autorange(threshold=0.05, max_run_time=10)
            if adaptive
            else timer.blocked_autorange(min_run_time=1.0)
        )
        medians.append(m.median)
    return "-", medians[0] / medians[1], time.perf_counter() - start


def pyperf(effect: float, quick: bool) -> tuple[str, float, float] | None:
    try:
        import pyperf as _  # noqa: F401
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pp_work.py").write_text(
            textwrap.dedent(
                """
                def work(n):
                    s = 0
                    for i in range(n):
                        s += i * i
                    return s
                """
            )
        )
        start = time.perf_counter()
        outs = []
        for i, n in enumerate((N, int(N * (1 + effect)))):
            out = Path(tmp) / f"arm{i}.json"
            cmd = [sys.executable, "-m", "pyperf", "timeit", "-q", "-o", str(out)]
            cmd += ["--fast"] if quick else []
            cmd += ["-s", "from pp_work import work", f"work({n})"]
            subprocess.run(cmd, cwd=tmp, check=True, capture_output=True, env={"PYTHONPATH": tmp})
            outs.append(str(out))
        done = subprocess.run(
            [sys.executable, "-m", "pyperf", "compare_to", *outs],
            capture_output=True,
            text=True,
            check=False,
        )
        elapsed = time.perf_counter() - start
    text = done.stdout
    m = re.search(r"([0-9.]+)x (slower|faster)", text)
    if "Not significant" in text or m is None:
        return "not significant", 1.0, elapsed
    ratio = float(m.group(1))
    return m.group(2), (1 / ratio if m.group(2) == "slower" else ratio), elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials, shorter budgets")
    parser.add_argument("--clock", default="cpu", choices=["cpu", "wall"])
    args = parser.parse_args()
    budget = 4.0 if args.quick else 10.0
    trials_aa = 10 if args.quick else 100
    trials_fx = 8 if args.quick else 40

    print(f"workload: work({N}) pure-Python loop; our clock={args.clock}, budget {budget:.0f} s")
    print(f"{'tool':34s} {'pair':5s} {'result':16s} {'ratio':>7s} {'seconds':>8s}")
    for effect, label in ((0.0, "A/A"), (0.05, "5%")):
        rows = [
            (f"ours ({args.clock} clock)", ours(effect, args.clock, budget)),
            ("ours (wall clock)", ours(effect, "wall", budget)),
            ("torch blocked_autorange(1s)", torch_timer(effect, adaptive=False)),
            ("torch adaptive_autorange(5%)", torch_timer(effect, adaptive=True)),
        ]
        pp = pyperf(effect, args.quick)
        rows.append(
            ("pyperf timeit" + (" --fast" if args.quick else ""), pp or ("not installed", 0, 0))
        )
        for name, (verdict, ratio, seconds) in rows:
            print(f"{name:34s} {label:5s} {verdict:16s} {ratio:7.3f} {seconds:8.1f}")

    for effect, trials in ((0.0, trials_aa), (0.03, trials_fx), (0.05, trials_fx)):
        verdicts: Counter[str] = Counter()
        seconds = 0.0
        for _ in range(trials):
            verdict, _, s = ours(effect, args.clock, budget)
            verdicts[verdict] += 1
            seconds += s
        if effect == 0.0:
            fp = verdicts["FASTER"] + verdicts["SLOWER"]
            print(
                f"A/A false-positive rate: {fp}/{trials} = {fp / trials:.1%} "
                f"(target <= 5%); verdicts {dict(verdicts)}; mean {seconds / trials:.1f} s/trial"
            )
        else:
            hit = verdicts["SLOWER"]
            print(
                f"detection of a {effect:.0%} effect: {hit}/{trials} = {hit / trials:.0%}; "
                f"verdicts {dict(verdicts)}; mean {seconds / trials:.1f} s/trial"
            )


if __name__ == "__main__":
    main()
