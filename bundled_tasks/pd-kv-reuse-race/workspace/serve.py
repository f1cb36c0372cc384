"""Drive a PD-disaggregated pair under load: the stress entry point the harness calls."""

from __future__ import annotations

import sys

import torch

from decode import DecodeScheduler
from kv_pool import SlotPool
from prefill import PrefillNode


def run_load(
    prompts: list[int],
    *,
    seed: int,
    concurrency: int,
    pages: int = 2,
    slot_elems: int = 16,
    spare_slots: int = 8,
    writers: int = 8,
    write_us: float = 300.0,
    stall_prob: float = 0.002,
    stall_min_ms: float = 25.0,
    stall_max_ms: float = 200.0,
    timeout_ms: float = 20.0,
    decode_steps: int = 8,
    step_us: float = 100.0,
) -> dict[str, torch.Tensor | int]:
    """Serve `prompts` with `concurrency` requests in flight; returns the outputs and counters."""
    # Many short-lived threads hand the GIL back and forth; the default 5 ms switch interval
    # would make every hand-off a convoy.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    pool = SlotPool(concurrency * pages + spare_slots, slot_elems)
    prefill = PrefillNode(
        pool,
        writers=writers,
        write_us=write_us,
        stall_prob=stall_prob,
        stall_min_ms=stall_min_ms,
        stall_max_ms=stall_max_ms,
        seed=seed,
    )
    scheduler = DecodeScheduler(
        pool,
        prefill,
        pages=pages,
        concurrency=concurrency,
        timeout_ms=timeout_ms,
        decode_steps=decode_steps,
        step_us=step_us,
    )
    try:
        outputs = scheduler.serve(prompts)
    finally:
        prefill.close()
        sys.setswitchinterval(switch_interval)
    return {"outputs": outputs, "aborts": scheduler.aborts}
