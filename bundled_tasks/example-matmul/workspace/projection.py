"""A projection layer's matrix product, y = x @ w, written as a broadcast and a sum."""

import torch


def project(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [m, k] float32, w [k, n] float32 -> y [m, n] float32."""
    # Outer products of every row of x with every column of w: an [m, k, n] temporary.
    return (x.unsqueeze(2) * w.unsqueeze(0)).sum(dim=1)
