"""Serving-side entry points: load the layer's weights once, then run batches through it."""

from __future__ import annotations

import torch

from moe import MoELayer

_layer: dict[str, MoELayer] = {}


def load_weights(router: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor, top_k: int) -> int:
    """Keep the MoE layer for the following calls; returns the number of experts."""
    _layer["moe"] = MoELayer(router, w_in, w_out, top_k)
    return int(router.shape[1])


def forward_batches(batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run each batch [N_i, d] through the layer as one forward pass; outputs in the same order."""
    layer = _layer["moe"]
    with torch.no_grad():
        return [layer.forward(x) for x in batches]


def forward_stages(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every intermediate of one forward pass over the batch `x` (for diagnosis)."""
    with torch.no_grad():
        return _layer["moe"].forward(x, return_stages=True)
