"""Decode attention on SGLang 0.5.23's CPU path without a server: the installed
`TorchNativeAttnBackend` (the backend a CPU without Intel AMX falls back to) against the open
task sglang-open-cpu-batch-job's reference.patch, timed on the tiny model's attention shapes.

    ~/.cache/infra-agent/sglang-0.5.23-venv/bin/python benchmarks/bench_sglang_open_attention.py \
        [--batches 1,8,32,64,128] [--min-len 64] [--max-len 192]

(run with SGLang's interpreter: it imports the installed `sglang`). For each decode batch size,
one layer's decode attention (`_run_sdpa_forward_decode`: 4 query heads, 2 KV heads, head size
32, bfloat16 KV cache, one OpenMP thread as the task's server runs) over requests whose contexts
are drawn from [min-len, max-len] tokens scattered in a 32768-slot KV pool: the CPU milliseconds
of the installed code and the patched, their ratio, and each one's largest error against the
same attention in float64 (the patch must not be less accurate). A step of the task's server runs
this once per layer (2 layers); the task's experiment says what it is worth end to end.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path
from types import ModuleType

import torch
from bench_sglang_real_faults import module as load_module  # this folder is on sys.path

REL = "sglang/srt/layers/attention/torch_native_backend.py"
PATCH = (
    Path(__file__).resolve().parent.parent
    / "bundled_tasks"
    / "sglang-open-cpu-batch-job"
    / "reference.patch"
)
HEADS, KV_HEADS, HEAD_DIM, POOL = 4, 2, 32, 32768


def module(patch: Path | None) -> ModuleType:
    """The backend module as installed, or with `patch` applied, imported under a private name."""
    return load_module(REL, patch)


def reference(q, k_cache, v_cache, req_to_token, pool_idx, seq_lens) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The same decode attention in float64, one request at a time."""
    out = []
    for i, (row, length) in enumerate(zip(pool_idx.tolist(), seq_lens.tolist(), strict=True)):
        loc = req_to_token[row, :length].long()
        k = k_cache[loc].double().repeat_interleave(HEADS // KV_HEADS, dim=1)  # [L, H, D]
        v = v_cache[loc].double().repeat_interleave(HEADS // KV_HEADS, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[i].double(), k) * HEAD_DIM**-0.5
        out.append(torch.einsum("hl,lhd->hd", scores.softmax(-1), v))
    return torch.stack(out)


def time_ms(fn, budget_s: float = 0.3, rounds: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Median over `rounds` of the mean ms per call within `budget_s`."""
    fn()
    means = []
    for _ in range(rounds):
        start, n = time.perf_counter(), 0
        while n < 3 or time.perf_counter() - start < budget_s:
            fn()
            n += 1
        means.append((time.perf_counter() - start) / n * 1e3)
    return sorted(means)[len(means) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32,64,128")
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=192)
    args = parser.parse_args()
    torch.set_num_threads(1)
    installed = module(None).TorchNativeAttnBackend
    patched = module(PATCH).TorchNativeAttnBackend
    gen = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16
    k_cache = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    v_cache = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
    req_to_token = torch.randint(1, POOL, (512, 4096), generator=gen, dtype=torch.int32)
    print(f"decode attention, one layer, contexts {args.min_len}-{args.max_len} tokens")
    print("batch  installed ms  patched ms  ratio  max error vs float64 (installed, patched)")
    for batch in (int(b) for b in args.batches.split(",")):
        pool_idx = torch.randperm(512, generator=gen)[:batch]
        seq_lens = torch.randint(args.min_len, args.max_len + 1, (batch,), generator=gen)
        q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen).to(dtype)
        exact = reference(q, k_cache, v_cache, req_to_token, pool_idx, seq_lens)
        row = []
        for backend in (installed, patched):
            out = torch.empty_like(q)
            step = functools.partial(
                backend._run_sdpa_forward_decode,
                None, q, out, k_cache, v_cache, req_to_token, pool_idx, seq_lens, None,
                scaling=HEAD_DIM**-0.5, enable_gqa=True, causal=False,
            )  # fmt: skip
            ms = time_ms(step)
            row.append((ms, (out.double() - exact).abs().max().item()))
        (a_ms, a_err), (b_ms, b_err) = row
        print(
            f"{batch:5d}  {a_ms:12.3f}  {b_ms:10.3f}  {a_ms / b_ms:5.2f}x  {a_err:.2e}, {b_err:.2e}"
        )


if __name__ == "__main__":
    main()
