"""The forward pass of a sparse-attention model over KV pages loaded from the host tier.

Per layer: the indexer's buffer accessor reads which positions to attend to, the layer waits for
its KV, then attention runs over the selected positions. Compute of layer l overlaps with the
loading of layers l+1, l+2, ...
"""

from __future__ import annotations

import time

import torch

from loader import LayerLoader


def indexer_positions(loader: LayerLoader, layer: int) -> torch.Tensor:
    """The sparse-attention indexer's buffer accessor: positions layer `layer` attends to."""
    return loader.device_index[layer].clone()


def forward(loader: LayerLoader, request: int, *, lead_us: float, compute_us: float) -> int:
    """Run one request through every layer; returns its output (an int64 checksum)."""
    spans = loader.spans
    start = time.perf_counter_ns()
    time.sleep(lead_us / 1e6)  # embedding and the dense first layers
    spans.append(("compute.lead", start, time.perf_counter_ns()))
    output = 0
    for layer in range(loader.device_kv.shape[0]):
        positions = indexer_positions(loader, layer)
        loader.wait_layer(layer)
        start = time.perf_counter_ns()
        selected = loader.device_kv[layer][positions]
        time.sleep(compute_us / 1e6)  # attention and MLP of this layer
        output += (layer + 1) * int(selected.sum())
        spans.append((f"compute.layer{layer}", start, time.perf_counter_ns()))
    return output
