"""How many requests a burst keeps running when the decode step's bookkeeping clears (or keeps) the
"batch is full" mark, without a server: SGLang 0.5.23's own `Scheduler.update_running_batch`, as
installed and with sglang-real-half-empty-batch's inject.patch applied, driven step by step.

    ~/.cache/infra-agent/sglang-0.5.23-venv/bin/python benchmarks/bench_sglang_admission.py \
        [--prompts 64] [--cap 16] [--lengths 13-256] [--seed 0]

(run with SGLang's interpreter: it imports the installed `sglang`). A burst of `--prompts`
requests, answer lengths drawn uniformly from `--lengths`, meets a server capped at `--cap`
running requests. Each step: if the running batch is not marked full, waiting requests are
admitted up to the cap and the batch is marked full when it reaches the cap (the admission pass's
rule); then every running request emits one token, the finished ones are marked, and the real
`update_running_batch` (stub batch and scheduler: no tensors, no KV) filters them out and decides
whether the mark stays. Prints, per variant, the decode steps the burst takes, the mean number of
requests per step, and the median and 90th-percentile request's wait for admission in steps, and
their ratios. These are scheduling quantities only: what a step costs, and so the wall-clock
effect, is the task's experiment to say (the server's step costs a fixed part plus a part per
running request, so fewer requests per step cost less than proportionally).
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench_sglang_real_faults import TASKS, module  # type: ignore[import-not-found]

TASK = TASKS / "sglang-real-half-empty-batch"
REL = "sglang/srt/managers/scheduler.py"


class Batch:
    """The fields and methods `update_running_batch` reads on a decode batch with room in KV."""

    def __init__(self) -> None:
        self.reqs: list[dict[str, int]] = []
        self.batch_is_full = False

    def batch_size(self) -> int:
        return len(self.reqs)

    def is_empty(self) -> bool:
        return not self.reqs

    def filter_batch(self, reqs_to_exclude: Any = None) -> None:
        self.reqs = [r for r in self.reqs if r["left"] > 0]

    def check_decode_mem(self) -> bool:
        return True

    def prepare_for_decode(self) -> None:
        pass


def burst(mod: Any, lengths: list[int], cap: int) -> tuple[int, float, list[int]]:
    """(decode steps, mean running requests per step, each request's wait in steps) for one
    burst under `mod`'s `update_running_batch`."""
    scheduler = SimpleNamespace(
        enable_skip_finishing_decode=False,
        result_queue=[],
        decode_offload_manager=None,
        forward_ct=0,
        new_token_ratio_tracker=SimpleNamespace(decay_step=lambda: None),
    )
    scheduler._reqs_finishing_inflight = lambda batch: mod.Scheduler._reqs_finishing_inflight(
        scheduler, batch
    )
    waiting = [{"id": i, "left": n} for i, n in enumerate(lengths)]
    batch, steps, running, waits = Batch(), 0, 0, [0] * len(lengths)
    while waiting or batch.reqs:
        if not batch.batch_is_full:
            while waiting and len(batch.reqs) < cap:
                req = waiting.pop(0)
                waits[req["id"]] = steps
                batch.reqs.append(req)
            batch.batch_is_full = len(batch.reqs) >= cap
        steps += 1
        running += len(batch.reqs)
        for req in batch.reqs:
            req["left"] -= 1
        mod.Scheduler.update_running_batch(scheduler, batch)
    return steps, running / steps, waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--cap", type=int, default=16)
    parser.add_argument("--lengths", default="13-256", help="lo-hi answer tokens (uniform)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    lo, hi = (int(x) for x in args.lengths.split("-"))
    rng = random.Random(args.seed)
    lengths = [rng.randint(lo, hi) for _ in range(args.prompts)]
    rows = {}
    for name, patch in (("installed", None), ("fault", TASK / "inject.patch")):
        mod = module(REL, Path(patch) if patch else None)
        steps, mean_bs, waits = burst(mod, lengths, args.cap)
        ordered = sorted(waits)
        rows[name] = (steps, mean_bs, ordered[len(ordered) // 2], ordered[len(ordered) * 9 // 10])
        print(
            f"{name:9s}: {steps} decode steps, {mean_bs:.1f} running requests per step, "
            f"wait for admission p50 {rows[name][2]} steps, p90 {rows[name][3]} steps "
            f"(mean answer {statistics.mean(lengths):.0f} tokens, cap {args.cap})"
        )
    a, b = rows["installed"], rows["fault"]
    print(
        f"fault/installed: steps {b[0] / a[0]:.2f}x, running per step {b[1] / a[1]:.2f}x, "
        f"wait p50 {b[2] / max(a[2], 1):.2f}x, p90 {b[3] / max(a[3], 1):.2f}x"
    )


if __name__ == "__main__":
    main()
