"""Engine steps of a prefill node serving an MoE model with PD disaggregation.

Each step dispatches the tokens of its MoE layers (main thread) while the KV-transfer thread ships
the step's KV pages to the decode node. The two are meant to overlap; the step is done when both
are (the scheduler reuses the step's pages right after it returns).
"""

from __future__ import annotations

import torch

from dispatch import intranode_dispatch
from kv_transfer import KVTransferWorker


class Engine:
    def __init__(
        self, received: torch.Tensor, *, moe_layers: int, dispatch_wait_us: int, chunk_wait_us: int
    ) -> None:
        self.moe_layers = moe_layers
        self.dispatch_wait_us = dispatch_wait_us
        self.worker = KVTransferWorker(received, chunk_wait_us)

    def step(self, step: int, pages: torch.Tensor, *, transfer: bool = True) -> None:
        """Dispatch this step's MoE layers while its KV `pages` [chunks, elems] ship; return when
        the step is done."""
        if transfer:
            self.worker.submit(step, pages)
        for _layer in range(self.moe_layers):
            intranode_dispatch(self.dispatch_wait_us)
        if transfer:
            self.worker.wait()

    def close(self) -> None:
        self.worker.close()
