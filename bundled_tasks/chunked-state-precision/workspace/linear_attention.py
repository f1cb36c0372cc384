"""Chunked linear attention (the chunk form of o_t = q_t S_t, S_t = sum_{s<=t} k_s^T v_s).

The sequence is cut into chunks of `chunk_size` tokens. Four stages, in execution order:

1. `intra`:        causal attention inside each chunk, (Q_c K_c^T * mask) V_c
2. `chunk_states`: each chunk's state contribution K_c^T V_c            [B, H, N, D, D]
3. `state_merge`:  the state entering each chunk, S_c = S_{c-1} + K_{c-1}^T V_{c-1}
                   (propagated across chunks with the accumulator in TF32, as on tensor cores)
4. `inter`:        the contribution of earlier chunks, Q_c S_c
and `output` = intra + inter. Shapes: q, k, v [B, H, T, D] float32, T a multiple of chunk_size.
"""

from __future__ import annotations

import torch


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to TF32 (10 mantissa bits), round-to-nearest."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


def _chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.reshape(b, h, t // chunk_size, chunk_size, d)


def _intra(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    size = q.shape[-2]
    mask = torch.ones(size, size, dtype=torch.bool).tril()
    scores = torch.matmul(q, k.transpose(-1, -2)).masked_fill(~mask, 0.0)
    return torch.matmul(scores, v)


def _chunk_states(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.matmul(k.transpose(-1, -2), v)


def _state_merge(chunk_states: torch.Tensor) -> torch.Tensor:
    """States entering each chunk: exclusive prefix sum over chunks, TF32 accumulator."""
    state = torch.zeros_like(chunk_states[:, :, 0])
    merged = []
    for c in range(chunk_states.shape[2]):
        merged.append(state)
        state = round_tf32(state + chunk_states[:, :, c])
    return torch.stack(merged, dim=2)


def chunked_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    chunk_size: int = 64,
    return_stages: bool = False,
) -> torch.Tensor | dict[str, torch.Tensor]:
    """Causal linear attention output [B, H, T, D]; with `return_stages`, every stage by name."""
    qc, kc, vc = (_chunks(x, chunk_size) for x in (q, k, v))
    intra = _intra(qc, kc, vc)
    chunk_states = _chunk_states(kc, vc)
    merged = _state_merge(chunk_states)
    inter = torch.matmul(qc, merged)
    output = (intra + inter).reshape(q.shape)
    if not return_stages:
        return output
    return {
        "intra": intra,
        "chunk_states": chunk_states,
        "state_merge": merged,
        "inter": inter,
        "output": output,
    }


def run_lengths(
    inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], *, chunk_size: int = 64
) -> list[torch.Tensor]:
    """Outputs for several sequences (one call per (q, k, v))."""
    return [chunked_linear_attention(q, k, v, chunk_size=chunk_size) for q, k, v in inputs]  # type: ignore[misc]
