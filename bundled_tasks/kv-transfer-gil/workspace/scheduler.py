"""The prefill node's serving loop: runs the engine one step at a time over a set of KV pages that
the next step reuses, as a real scheduler reuses a finished step's buffers. Not part of the code a
patch may change (task.toml's `editable`): it is the world the engine runs in.
"""

from __future__ import annotations

from typing import Any

import torch

from engine import Engine


def run_steps(
    kv: torch.Tensor,
    *,
    moe_layers: int,
    dispatch_wait_us: int,
    chunk_wait_us: int,
    transfer: bool = True,
) -> dict[str, Any]:
    """Run one step per row of `kv` [steps, chunks, elems]. Returns what the decode side received
    (all zeros when `transfer` is False: dispatch only, the no-transfer baseline of a step) and
    the steps that returned before their transfer had completed."""
    received = torch.zeros_like(kv)
    pages = torch.empty_like(kv[0])  # the step's KV pages, reused by the next step
    late: list[int] = []
    engine = Engine(
        received,
        moe_layers=moe_layers,
        dispatch_wait_us=dispatch_wait_us,
        chunk_wait_us=chunk_wait_us,
    )
    try:
        for step in range(kv.shape[0]):
            pages.copy_(kv[step])  # the forward wrote this step's KV
            engine.step(step, pages, transfer=transfer)
            if transfer and not torch.equal(received[step], pages):
                late.append(step)  # the pages are about to be overwritten mid-transfer
    finally:
        engine.close()
    return {"received": received, "late_steps": late}
