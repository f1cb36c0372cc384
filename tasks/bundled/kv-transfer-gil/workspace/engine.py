"""Engine steps of a prefill node serving an MoE model with PD disaggregation.

Each step dispatches the tokens of its MoE layers (main thread) while the KV-transfer thread ships
the step's KV pages to the decode node. The two are meant to overlap.
"""

from __future__ import annotations

import torch

from dispatch import intranode_dispatch
from kv_transfer import KVTransferWorker


def run_steps(
    kv: torch.Tensor,
    *,
    moe_layers: int,
    dispatch_wait_us: int,
    chunk_wait_us: int,
    transfer: bool = True,
) -> torch.Tensor:
    """Run one step per row of `kv` [steps, chunks, elems]; returns what the decode side received
    (all zeros when `transfer` is False: dispatch only, the no-transfer baseline of a step)."""
    received = torch.zeros_like(kv)
    worker = KVTransferWorker(received, chunk_wait_us)
    try:
        for step in range(kv.shape[0]):
            if transfer:
                worker.submit(step, kv[step])
            for _layer in range(moe_layers):
                intranode_dispatch(dispatch_wait_us)
            if transfer:
                worker.wait()
    finally:
        worker.close()
    return received
