"""Benchmark: output throughput of the real SGLang CPU server under two knob settings.

Starts one server per setting (both stay up), runs `--reps` interleaved workload repetitions
(A B B A ...), and prints each run, the medians and the bootstrap ratio with its interval: the
noise a single run would hide. Prints numbers only; it asserts nothing.

    .venv/bin/python benchmarks/bench_serving_knobs.py --reps 6 \
        --candidate '{"chunked-prefill-size": 64}'
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from infra_agent.feedback.bench import compare_samples
from infra_agent.serving.deployment import load_deployment
from infra_agent.serving.load.datasets import random_sessions
from infra_agent.serving.load.generator import LoadSpec, run_workload
from infra_agent.serving.load.metrics import summarize
from infra_agent.serving.server import Server

TASK = Path(__file__).resolve().parents[1] / "bundled_tasks" / "sglang-cpu-tiny"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="{}", help="knobs of arm A (JSON)")
    parser.add_argument(
        "--candidate", default='{"chunked-prefill-size": 64}', help="knobs of arm B (JSON)"
    )
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    args = parser.parse_args()
    spec = load_deployment(TASK / "deployment.toml")
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    arms = {"A": json.loads(args.baseline), "B": json.loads(args.candidate)}
    servers = {}
    try:
        for name, knobs in arms.items():
            servers[name] = Server.start(spec, work / name, knobs=knobs)
            print(f"arm {name} {knobs}: ready in {servers[name].ready_s:.1f} s", flush=True)
        samples: dict[str, list[float]] = {"A": [], "B": []}
        for rep in range(args.reps):
            order = ("A", "B") if rep % 2 == 0 else ("B", "A")
            for name in order:
                sessions = random_sessions(
                    args.prompts, args.input_len, args.output_len, vocab_size=1024, seed=rep
                )
                metrics = summarize(servers[name].call(run_workload, sessions, LoadSpec(seed=rep)))
                samples[name].append(metrics.output_throughput)
                print(f"rep {rep} arm {name}: {metrics.render()}", flush=True)
        comparison = compare_samples(samples["A"], samples["B"], higher_is_better=True, paired=True)
        print(comparison.render())
    finally:
        for server in servers.values():
            server.stop()


if __name__ == "__main__":
    main()
