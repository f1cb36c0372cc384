"""The decode side of a server in miniature: it holds a KV cache and answers decode steps."""

from __future__ import annotations

import torch

from attention import split_decode_attention

_cache: dict[str, torch.Tensor] = {}


def load_cache(k: torch.Tensor, v: torch.Tensor) -> list[int]:
    """Keep the KV cache (k, v: [B, H, S, D] float32) for the following decode steps."""
    _cache["k"] = k.contiguous()
    _cache["v"] = v.contiguous()
    return list(k.shape)


def decode(
    queries: torch.Tensor, *, num_splits: int = 4, block_size: int = 64, threads: int = 1
) -> torch.Tensor:
    """Run one decode step per query in `queries` [steps, B, H, D]; outputs [steps, B, H, D]."""
    torch.set_num_threads(threads)
    k, v = _cache["k"], _cache["v"]
    outs = [
        split_decode_attention(q, k, v, num_splits=num_splits, block_size=block_size)
        for q in queries
    ]
    return torch.stack(outs)
