"""Serve requests whose KV lives in the host tier: the stress entry point the harness calls."""

from __future__ import annotations

import sys

import torch

from forward import forward
from host_cache import HostTier
from loader import LayerLoader


def run_load(
    prompts: list[int],
    *,
    seed: int,
    layers: int = 4,
    page_elems: int = 256,
    topk: int = 16,
    load_us: float = 80.0,
    stall_prob: float = 0.02,
    stall_us: float = 3000.0,
    lead_us: float = 250.0,
    compute_us: float = 300.0,
    overlap: bool = True,
) -> dict[str, torch.Tensor | list[tuple[str, int, int]]]:
    """Serve every prompt in turn, loading its layers while it computes (`overlap`; otherwise the
    whole load finishes before the forward starts); returns the outputs and the load/compute
    spans (name, start ns, end ns) of the run."""
    # The load thread and the forward hand the GIL back and forth at every layer; the default
    # 5 ms switch interval would make each hand-off a convoy.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    host = HostTier(prompts, layers, page_elems, topk)
    device_kv = torch.zeros(layers, page_elems, dtype=torch.int64)
    device_index = torch.zeros(layers, topk, dtype=torch.int64)
    loader = LayerLoader(
        host, device_kv, device_index,
        load_us=load_us, stall_prob=stall_prob, stall_us=stall_us, seed=seed,
    )  # fmt: skip
    outputs = torch.zeros(len(prompts), dtype=torch.int64)
    try:
        for request in range(len(prompts)):
            loader.start(request)
            if not overlap:
                loader.wait_layer(layers - 1)
            outputs[request] = forward(loader, request, lead_us=lead_us, compute_us=compute_us)
            loader.wait_layer(layers - 1)  # the buffers are reused by the next request
    finally:
        loader.close()
        sys.setswitchinterval(switch_interval)
    return {"outputs": outputs, "spans": loader.spans}
