"""Benchmark: where the variance of a serving measurement comes from (sglang-cpu-tiny, A/A).

Starts two servers with the same arguments, the task's default knobs (an A/A pair: any
difference is noise), and, for each
condition below, takes `--pairs` interleaved pairs (AB, BA, ...; both arms of a pair on the same
seed), then prints per condition: the spread of the per-pair log ratio of output throughput
(the noise a paired experiment sees; sd and a robust sd from the MAD), the spread of the
throughput itself, the same for output tokens per server CPU-second, the mean sample time, and
where the CPU went (server processes by name, the load generator). Conditions:

- shared: both servers running while one is measured, no warm-up (the measurement before
  issue 22): the idle server's scheduler polls without sleeping;
- frozen: the idle arm's server stopped (SIGSTOP) while the other is measured;
- frozen+warm: frozen, and a short discarded burst after every switch of arms;
- frozen+warm xN: the same with N times the prompts per sample (workload length);
- poisson: frozen+warm with Poisson arrivals at 40 requests/s instead of all at once;
- shared+warm: both running, with warm-up (the freeze's share without the warm-up's).

Before the servers start it prints the machine's own floor: a fixed pure-Python loop timed over
adjacent windows as long as a sample (`machine`): on a shared VM the host's speed wanders, and
no measurement design removes what the machine itself does between one window and the next.

`--busy N` starts N `yes > /dev/null` processes first (load N and more); the machine's load
is printed before and after. Prints numbers only; it asserts nothing. Nothing else heavy should
share the machine: it measures whatever shares the cores.

    .venv/bin/python benchmarks/bench_serving_noise.py --pairs 10 --busy 0
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra_agent.sandboxes.proctree import cpu_by_name
from infra_agent.serving.deployment import load_deployment
from infra_agent.serving.load.datasets import random_sessions
from infra_agent.serving.load.generator import LoadSpec, run_workload
from infra_agent.serving.load.metrics import summarize
from infra_agent.serving.server import Server
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.patch import effective_knobs

TASK = Path(__file__).resolve().parents[1] / "bundled_tasks" / "sglang-cpu-tiny"
VOCAB = 1024


@dataclass
class Condition:
    name: str
    freeze: bool
    warm: bool
    scale: int = 1
    rate: float = math.inf


@dataclass
class Outcome:
    throughput: dict[str, list[float]] = field(default_factory=lambda: {"A": [], "B": []})
    per_cpu: dict[str, list[float]] = field(default_factory=lambda: {"A": [], "B": []})
    seconds: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    client_cpu: float = 0.0
    idle_arm_cpu: float = 0.0
    lag_ms: list[float] = field(default_factory=list)
    """Per request: latency seen by the client minus the server's own e2e_latency."""
    latency_ms: list[float] = field(default_factory=list)
    loop_lag_p99_ms: list[float] = field(default_factory=list)
    """Per sample: p99 of how late the client's event loop woke."""


def busy(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(n)]


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_floor(window_s: float, pairs: int) -> str:
    """The machine's own noise: a fixed pure-Python loop timed over adjacent windows of
    `window_s` (a sample's length), as pairs; no server runs meanwhile."""

    def speed() -> float:
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < window_s:
            total = 0
            for i in range(20_000):
                total += i * i
            done += 1
        return done / (time.perf_counter() - started)

    ratios = [speed() / speed() for _ in range(pairs)]
    sd, robust = spread(ratios)
    return (
        f"{'machine':<16} pairs {pairs:>2}  window {window_s:4.1f} s  a fixed Python loop, "
        f"adjacent windows: pair sd {sd:5.1%} (robust {robust:5.1%})"
    )


def spread(ratios: list[float]) -> tuple[float, float]:
    """(sd, MAD-based robust sd) of log ratios, as fractions."""
    logs = [math.log(r) for r in ratios]
    med = statistics.median(logs)
    mad = statistics.median(abs(x - med) for x in logs) * 1.4826
    return statistics.stdev(logs), mad


def sample(
    server: Server,
    cond: Condition,
    seed: int,
    prompts: int,
    warm: int,
    out: Outcome,
    name: str,
) -> None:
    """One measured run; `warm` requests first, discarded (0: none)."""
    if warm:
        burst = random_sessions(warm, 64, 32, vocab_size=VOCAB, seed=seed + 7)
        server.call(run_workload, burst, LoadSpec())
    sessions = random_sessions(prompts * cond.scale, 64, 32, vocab_size=VOCAB, seed=seed)
    before = cpu_by_name(server.processes())
    started = time.monotonic()
    result = server.call(run_workload, sessions, LoadSpec(seed=seed, request_rate=cond.rate))
    out.seconds.append(time.monotonic() - started)
    after = cpu_by_name(server.processes())
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    m = summarize(result)
    out.throughput[name].append(m.output_throughput)
    out.per_cpu[name].append(m.output_tokens / sum(used.values()))
    for k, v in used.items():
        out.cpu[k] = out.cpu.get(k, 0.0) + v
    out.client_cpu += result.client_cpu_s or 0.0
    out.loop_lag_p99_ms.append(result.client_loop_lag_s.get("p99", 0.0) * 1e3)
    for r in result.records:
        if "e2e_latency" in r.meta:
            out.lag_ms.append((r.latency_s - float(r.meta["e2e_latency"])) * 1e3)
            out.latency_ms.append(r.latency_s * 1e3)


def run(
    servers: dict[str, Server], cond: Condition, pairs: int, prompts: int, seed0: int, warm: int
) -> Outcome:
    out = Outcome()
    last = None
    for i in range(pairs):
        seed = seed0 + i
        for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
            other = servers["B" if name == "A" else "A"]
            if cond.freeze:
                other.pause()
            servers[name].resume()
            idle_before = other.cpu_seconds()
            burst = warm if cond.warm and last != name else 0
            sample(servers[name], cond, seed, prompts, burst, out, name)
            out.idle_arm_cpu += other.cpu_seconds() - idle_before
            last = name
    for s in servers.values():
        s.resume()
    return out


def report(cond: Condition, out: Outcome) -> str:
    ratios = [b / a for a, b in zip(out.throughput["A"], out.throughput["B"], strict=True)]
    cpu_ratios = [b / a for a, b in zip(out.per_cpu["A"], out.per_cpu["B"], strict=True)]
    sd, robust = spread(ratios)
    logs = [math.log(r) for r in ratios]
    # Even pairs run A then B (B right after a switch), odd pairs B then A: half the difference
    # of their mean log ratios is what being first after a switch costs (or gains).
    switch = (statistics.mean(logs[0::2]) - statistics.mean(logs[1::2])) / 2
    csd, crobust = spread(cpu_ratios)
    allv = out.throughput["A"] + out.throughput["B"]
    n = len(out.seconds)
    wall = sum(out.seconds)
    top = sorted(out.cpu.items(), key=lambda kv: -kv[1])[:4]
    cpu = ", ".join(f"{k} {v / wall:.2f}" for k, v in top)
    lag = statistics.quantiles(out.lag_ms, n=100) if len(out.lag_ms) > 2 else [0.0] * 99
    return (
        f"{cond.name:<16} pairs {len(ratios):>2}  sample {wall / n:5.1f} s  "
        f"tput {statistics.median(allv):6.0f} tok/s (cv {statistics.stdev(allv) / statistics.mean(allv):5.1%})  "
        f"pair sd {sd:5.1%} (robust {robust:5.1%}, switch effect {switch:+.1%})  "
        f"tok/CPU-s pair sd {csd:5.1%} (robust {crobust:5.1%})\n"
        f"{'':<16} cores used while measured: {cpu}; client {out.client_cpu / wall:.2f}; "
        f"idle arm {out.idle_arm_cpu / wall:.2f}\n"
        f"{'':<16} client latency - server e2e latency: p50 {lag[49]:.0f} ms, p99 {lag[98]:.0f} ms "
        f"(request latency p50 {statistics.median(out.latency_ms):.0f} ms); client event loop "
        f"wakes late by {statistics.median(out.loop_lag_p99_ms):.0f} ms at p99 (median sample)"
    )


CONDITIONS = {
    "shared": Condition("shared", freeze=False, warm=False),
    "shared+warm": Condition("shared+warm", freeze=False, warm=True),
    "frozen": Condition("frozen", freeze=True, warm=False),
    "frozen+warm": Condition("frozen+warm", freeze=True, warm=True),
    "frozen+warm x2": Condition("frozen+warm x2", freeze=True, warm=True, scale=2),
    "frozen+warm x4": Condition("frozen+warm x4", freeze=True, warm=True, scale=4),
    "poisson": Condition("poisson", freeze=True, warm=True, rate=40.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--busy", type=int, default=0, help="`yes > /dev/null` processes to add")
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--window", type=float, default=2.5, help="seconds per machine window")
    parser.add_argument("--warm", type=int, default=16, help="requests discarded after a switch")
    parser.add_argument(
        "--knobs",
        default="",
        help="server arguments of both arms over the task's defaults, k=v,...",
    )
    args = parser.parse_args()
    knobs = effective_knobs(None, load_task(TASK).manifest)
    knobs |= dict(kv.split("=", 1) for kv in args.knobs.split(",") if kv)
    spec = load_deployment(TASK / "deployment.toml")
    work = Path(tempfile.mkdtemp(prefix="bench-noise-"))
    print(f"load before: {load_avg()}", flush=True)
    hogs = busy(args.busy)
    servers: dict[str, Server] = {}
    try:
        print(machine_floor(args.window, args.pairs), flush=True)
        print(f"server arguments of both arms: {knobs}", flush=True)
        for name in ("A", "B"):
            for s in servers.values():
                s.pause()
            servers[name] = Server.start(spec, work / name, knobs=knobs)
            print(f"server {name}: ready in {servers[name].ready_s:.1f} s", flush=True)
        for s in servers.values():
            s.resume()
            s.call(run_workload, random_sessions(8, 16, 8, vocab_size=VOCAB, seed=1), LoadSpec())
        idle0 = {n: s.cpu_seconds() for n, s in servers.items()}
        time.sleep(5)
        idle = {n: (s.cpu_seconds() - idle0[n]) / 5 for n, s in servers.items()}
        print(f"idle servers use {idle['A']:.2f} and {idle['B']:.2f} cores", flush=True)
        rec = servers["A"].call(
            run_workload, random_sessions(2, 16, 8, vocab_size=VOCAB, seed=2), LoadSpec()
        )
        print(f"meta keys: {sorted(rec.records[0].meta)}", flush=True)
        seed0 = 1000
        for key in args.conditions.split(","):
            cond = CONDITIONS[key]
            out = run(servers, cond, args.pairs, args.prompts, seed0, args.warm)
            seed0 += 1000
            print(report(cond, out), flush=True)
    finally:
        for s in servers.values():
            s.stop()
        for h in hogs:
            h.kill()
            h.wait()
        print(f"load after: {load_avg()}", flush=True)


if __name__ == "__main__":
    main()
