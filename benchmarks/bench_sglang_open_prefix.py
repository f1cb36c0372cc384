"""Prefill (extend) attention after a cached prefix on SGLang 0.5.23's CPU path without a server:
the installed `TorchNativeAttnBackend` against the open task sglang-open-cpu-shared-prompt's
reference.patch, timed on the tiny model's attention shapes.

    ~/.cache/infra-agent/sglang-0.5.23-venv/bin/python benchmarks/bench_sglang_open_prefix.py \
        [--cases 0+2048,2048+64,2048+128,1024+64,512+256] [--requests 4]

(run with SGLang's interpreter: it imports the installed `sglang`). Each case is PREFIX+NEW: a
prefill batch of `--requests` requests, each with PREFIX tokens already in the KV cache (a prefix
cache hit) and NEW tokens to prefill; one layer's `_run_sdpa_forward_extend` (4 query heads, 2 KV
heads, head size 32, bfloat16, one OpenMP thread as the task's server runs): the CPU
milliseconds of the installed code and the patched, their ratio, and each one's largest error
against the same causal attention in float64 (the patch must not be less accurate). The task's
server runs this once per layer (2 layers) for every prefill batch; its experiment says what it is
worth end to end.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import torch
from bench_sglang_open_attention import HEAD_DIM, HEADS, KV_HEADS, module, time_ms

PATCH = (
    Path(__file__).resolve().parent.parent
    / "bundled_tasks"
    / "sglang-open-cpu-shared-prompt"
    / "reference.patch"
)


def reference(q, k_cache, v_cache, rows, prefix: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The same attention in float64, one request at a time: new token i of a request sees its
    context's first prefix + i + 1 tokens."""
    new = q.shape[0] // rows.shape[0]
    out = []
    for r, row in enumerate(rows):
        k = k_cache[row].double().repeat_interleave(HEADS // KV_HEADS, dim=1)  # [L, H, D]
        v = v_cache[row].double().repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = torch.einsum("qhd,lhd->hql", q[r * new : (r + 1) * new].double(), k)
        seen = torch.arange(row.shape[0]) <= prefix + torch.arange(new).unsqueeze(1)
        scores = (scores * HEAD_DIM**-0.5).masked_fill(~seen, float("-inf"))
        out.append(torch.einsum("hql,lhd->qhd", scores.softmax(-1), v))
    return torch.cat(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="0+2048,2048+64,2048+128,1024+64,512+256")
    parser.add_argument("--requests", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    installed = module(None).TorchNativeAttnBackend
    patched = module(PATCH).TorchNativeAttnBackend
    gen = torch.Generator().manual_seed(0)
    dtype, n = torch.bfloat16, args.requests
    print(f"extend attention, one layer, {n} requests of PREFIX cached + NEW tokens")
    print("prefix+new  installed ms  patched ms  ratio  max error vs float64 (installed, patched)")
    for case in args.cases.split(","):
        prefix, new = (int(x) for x in case.split("+"))
        length = prefix + new
        pool = n * length + 1
        k_cache = torch.randn(pool, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
        v_cache = torch.randn(pool, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
        rows = torch.randperm(pool - 1, generator=gen)[: n * length].view(n, length) + 1
        q = torch.randn(n * new, HEADS, HEAD_DIM, generator=gen).to(dtype)
        exact = reference(q, k_cache, v_cache, rows, prefix)
        result = []
        for backend in (installed, patched):
            out = torch.empty_like(q)
            step = functools.partial(
                backend._run_sdpa_forward_extend,
                None, q, out, k_cache, v_cache, rows, torch.arange(n),
                torch.full((n,), length), torch.full((n,), prefix), torch.full((n,), new),
                scaling=HEAD_DIM**-0.5, enable_gqa=True, causal=True,
            )  # fmt: skip
            ms = time_ms(step)
            result.append((ms, (out.double() - exact).abs().max().item()))
        (a_ms, a_err), (b_ms, b_err) = result
        print(
            f"{case:>11}  {a_ms:12.2f}  {b_ms:10.2f}  {a_ms / b_ms:5.1f}x  {a_err:.2e}, {b_err:.2e}"
        )


if __name__ == "__main__":
    main()
