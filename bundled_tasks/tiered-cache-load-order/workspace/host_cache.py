"""The host-memory tier of a hierarchical KV cache (HiCache in miniature), and the model's KV.

For each cached request the host keeps, per layer, its KV page and the sparse-attention indexer's
buffer (which KV positions the layer attends to).
"""

from __future__ import annotations

import torch

MODULUS = 1_000_000_007


def layer_kv(prompt: int, layers: int, page_elems: int) -> torch.Tensor:
    """KV pages of a request: [layers, page_elems] int64, a function of its prompt."""
    pos = torch.arange(page_elems, dtype=torch.int64)
    layer = torch.arange(layers, dtype=torch.int64).unsqueeze(1)
    return (pos * 7919 + prompt * 31 + layer * 1_000_003) % MODULUS


def layer_index(prompt: int, layers: int, page_elems: int, topk: int) -> torch.Tensor:
    """The indexer's selected positions per layer: [layers, topk] int64 in [0, page_elems)."""
    slot = torch.arange(topk, dtype=torch.int64)
    layer = torch.arange(layers, dtype=torch.int64).unsqueeze(1)
    return (slot * 37 + prompt + layer * 11) % page_elems


class HostTier:
    """Host copies of the cached requests' pages, keyed by request index."""

    def __init__(self, prompts: list[int], layers: int, page_elems: int, topk: int) -> None:
        self.kv = [layer_kv(p, layers, page_elems) for p in prompts]
        self.index = [layer_index(p, layers, page_elems, topk) for p in prompts]
