"""Slowdown of a target process while the GIL tracer samples it (py-spy dump, default rate).

    .venv/bin/python benchmarks/bench_feedback_gil.py [--quick]

The target runs a fixed amount of pure-Python work in two threads and prints its own wall time.
Runs alternate untraced / traced (trace_pid at the default rate, and at two other settings);
prints median wall times and the slowdown (target <= 5% at the default rate).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from infra_agent.feedback.gil import trace_pid

TARGET = """
import threading, time, sys
def work():
    s = 0
    for i in range(int(sys.argv[1])):
        s += i * i
start = time.perf_counter()
threads = [threading.Thread(target=work) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(time.perf_counter() - start)
"""


def run_target(
    script: Path, n: int, traced: bool, interval_s: float = 1.0, native: bool = True
) -> tuple[float, int]:
    proc = subprocess.Popen(
        [sys.executable, str(script), str(n)], stdout=subprocess.PIPE, text=True
    )
    snapshots = [0]
    if traced:

        def trace() -> None:
            try:
                snapshots[0] = trace_pid(
                    proc.pid, duration_s=60, interval_s=interval_s, native=native
                ).snapshots
            except Exception:  # the target exited between two dumps
                pass

        tracer = threading.Thread(target=trace)
        tracer.start()
    out, _ = proc.communicate()
    if traced:
        tracer.join()
    return float(out.strip()), snapshots[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 pairs per setting")
    args = parser.parse_args()
    pairs = 2 if args.quick else 6
    n = 4_000_000
    settings = [
        ("default: 1 snapshot/s, native frames", 1.0, True),
        ("10 snapshots/s, native frames", 0.1, True),
        ("1 snapshot/s, no native frames", 1.0, False),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "target.py"
        script.write_text(TARGET)
        for label, interval_s, native in settings:
            plain, traced, dumps = [], [], []
            for _ in range(pairs):
                plain.append(run_target(script, n, False)[0])
                t, k = run_target(script, n, True, interval_s, native)
                traced.append(t)
                dumps.append(k)
            p, t = statistics.median(plain), statistics.median(traced)
            print(
                f"{label:38s} untraced {p:.2f} s, traced {t:.2f} s, snapshots {dumps}: "
                f"slowdown {t / p - 1:+.1%} (target <= 5% at the default)"
            )


if __name__ == "__main__":
    main()
