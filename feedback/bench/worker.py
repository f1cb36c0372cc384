"""Benchmark worker process: `python -m infra_agent.feedback.bench.worker module:function`.

Reads an iteration count per line on stdin, answers seconds per iteration (perf_counter_ns) on
stdout, or `error <message>`. Prints `ready` once the function is loaded. Exits at end of input.
"""

from __future__ import annotations

import sys
import time


def main(spec: str) -> int:
    from infra_agent.errors import UserError
    from infra_agent.feedback.bench.usercode import load_callable

    try:
        fn = load_callable(spec)
    except UserError as exc:
        print(f"error {exc}", flush=True)
        return 2
    print("ready", flush=True)
    for line in sys.stdin:
        iterations = int(line)
        try:
            start = time.perf_counter_ns()
            for _ in range(iterations):
                fn()
            elapsed = time.perf_counter_ns() - start
        except Exception as exc:  # the user's code failed: report it, don't die silently
            print(f"error {type(exc).__name__}: {exc}".replace("\n", " "), flush=True)
            continue
        print(f"{elapsed / 1e9 / iterations!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
