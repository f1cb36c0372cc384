"""Split-K decode attention over a paged KV cache (flash-decoding layout, CPU float32).

One query token per sequence attends to the whole cached sequence. The sequence is cut into
`num_splits` contiguous splits (each a whole number of `block_size`-token pages); every split
produces its part of the output and the parts are summed.
"""

from __future__ import annotations

import math

import torch


def split_bounds(seq_len: int, num_splits: int, block_size: int) -> list[tuple[int, int]]:
    """[start, end) token ranges of the splits, aligned to pages of `block_size` tokens."""
    pages = math.ceil(seq_len / block_size)
    per_split = math.ceil(pages / max(1, num_splits))
    bounds = []
    for first in range(0, pages, per_split):
        start = first * block_size
        end = min(seq_len, (first + per_split) * block_size)
        bounds.append((start, end))
    return bounds


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, H, D] against k [B, H, S, D] -> scaled scores [B, H, S]."""
    return torch.matmul(k, q.unsqueeze(-1)).squeeze(-1) * scale


def _row_normalizer(q: torch.Tensor, k: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax max and denominator of each (batch, head) row over the whole sequence."""
    scores = _scores(q, k, scale)
    row_max = scores.amax(dim=-1)
    row_sum = torch.exp(scores - row_max.unsqueeze(-1)).sum(dim=-1)
    return row_max, row_sum


def split_decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    num_splits: int = 4,
    block_size: int = 64,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for one decode step: q [B, H, D], k and v [B, H, S, D]."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    out = torch.zeros_like(q)
    for start, end in split_bounds(k.shape[2], num_splits, block_size):
        # Each split normalizes its probabilities with the row's global softmax statistics.
        row_max, row_sum = _row_normalizer(q, k, scale)
        for page in range(start, end, block_size):
            stop = min(end, page + block_size)
            scores = _scores(q, k[:, :, page:stop], scale)
            probs = torch.exp(scores - row_max.unsqueeze(-1)) / row_sum.unsqueeze(-1)
            out += torch.matmul(probs.unsqueeze(-2), v[:, :, page:stop]).squeeze(-2)
    return out
