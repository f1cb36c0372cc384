"""A mixture-of-experts layer (top-k routing, GELU expert MLPs, weighted combine).

Stages, in execution order: `router_logits` [N, E] -> top-k `gates` [N, K] -> `expert_out`
[N, K, d] (each token's expert outputs, top-k slot order) -> `combine` [N, d], the gate-weighted
sum of a token's expert outputs, accumulated in bf16 (the dtype of the serving activations).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class MoELayer:
    def __init__(self, router: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor, top_k: int):
        self.router = router  # [d, E]
        self.w_in = w_in  # [E, d, h]
        self.w_out = w_out  # [E, h, d]
        self.top_k = top_k

    def forward(self, x: torch.Tensor, return_stages: bool = False):
        """x [N, d] float32 -> [N, d] float32 (or every stage by name with `return_stages`)."""
        n, d = x.shape
        logits = x @ self.router
        top_vals, top_idx = torch.topk(logits, self.top_k, dim=-1)
        gates = torch.softmax(top_vals, dim=-1)
        expert_out = torch.zeros(n, self.top_k, d)
        combined = torch.zeros(n, d, dtype=torch.bfloat16)
        # Busiest experts first, so the largest GEMMs start earliest.
        load = torch.bincount(top_idx.flatten(), minlength=self.router.shape[1])
        for e in torch.argsort(load, descending=True, stable=True).tolist():
            if load[e] == 0:
                continue
            token, slot = torch.nonzero(top_idx == e, as_tuple=True)
            y = F.gelu(x[token] @ self.w_in[e]) @ self.w_out[e]
            expert_out[token, slot] = y
            contribution = (gates[token, slot].unsqueeze(-1) * y).to(torch.bfloat16)
            combined.index_add_(0, token, contribution)
        out = combined.float()
        if not return_stages:
            return out
        return {
            "router_logits": logits,
            "gates": gates,
            "expert_out": expert_out,
            "combine": out,
        }
