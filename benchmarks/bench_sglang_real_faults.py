"""The per-step cost of the sglang-real tasks' faults, without a server: SGLang 0.5.23's own
functions, as installed and with the task's inject.patch applied, timed on the tiny model's
tokenizer as an output grows.

    ~/.cache/infra-agent/sglang-0.5.23-venv/bin/python benchmarks/bench_sglang_real_faults.py \
        --tokenizer FOLDER [--requests 16] [--positions 32,128,512] [--queue-lens 64,128,256,512]

(run with SGLang's interpreter: it imports the installed `sglang`; FOLDER holds the tiny model's
tokenizer, e.g. written by `infra_agent.serving.tiny_model.write_tiny_model`). Prints, per task and
output position, the CPU milliseconds of one streamed step for `--requests` requests with the
installed code and with the fault, and their ratio. A step here is only the faulty function's work
(detokenizing one step's outputs; converting one chunk's logprobs; encoding one chunk of the native
endpoint's stream with top-5 logprobs), not a server's whole step: the ratio says how the fault's
work grows, the task's experiment says what it costs. For the scheduling task the unit is one
priority pass of the scheduler over a waiting queue of each `--queue-lens` length (what every
scheduling pass with room in the batch runs). For the numerics task, the top-5 log-probability
error that bfloat16 logits carry by themselves. For the single-token job, releasing the KV rows of
one prefill batch of `--batch` finished requests with SGLang's allocator as installed, inside one
free group (the installed prefill path) and one free per request (the path with the fault), at each
`--pools` size of the KV pool. For the ban-list job, building one prefill batch's sampling
parameters (`SamplingBatchInfo.from_schedule_batch`) for each `--bias-batches` size, every request
banning the same `--banned` token ids. For the chat job, the output position at which a streamed
request's first chunk leaves the scheduler, at server stream intervals 1 to 16 (no CPU time: that
fault adds waiting, not work).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import sglang  # type: ignore[import-not-found]

TASKS = Path(__file__).resolve().parent.parent / "bundled_tasks"
PACKAGE = Path(sglang.__file__).parent.parent


def module(rel: str, patch: Path | None) -> ModuleType:
    """`rel` (e.g. sglang/srt/managers/x.py) as installed, or with `patch` applied, imported
    under a private name."""
    name = (
        f"bench_{rel.replace('/', '_').removesuffix('.py')}_{'patched' if patch else 'installed'}"
    )
    with tempfile.TemporaryDirectory(prefix="bench-sglang-") as scratch:
        source = PACKAGE / rel
        if patch is not None:
            (Path(scratch) / rel).parent.mkdir(parents=True)
            (Path(scratch) / rel).write_bytes(source.read_bytes())
            cmd = ["patch", "-s", "-p1", "-d", scratch, "-i", str(patch)]
            subprocess.run(cmd, check=True)
            source = Path(scratch) / rel
        spec = importlib.util.spec_from_file_location(name, source)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


def first_chunk_steps(mod: ModuleType, intervals: list[int], output_len: int) -> list[int]:
    """For the chat job: the output position (1 = the token prefill samples) at which a streamed
    request's first chunk leaves the scheduler, at each server stream interval in `intervals`,
    with `mod`'s stream accumulator deciding step by step (a fresh accumulator per step, as
    every scheduler step builds one). No CPU time: the fault adds waiting, not work; each
    position past 1 is one more decode step of the whole batch before the first token shows."""
    from array import array

    from sglang.srt.disaggregation.utils import DisaggregationMode  # type: ignore[import-not-found]
    from sglang.srt.managers.schedule_batch import Req  # type: ignore[import-not-found]
    from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore[import-not-found]
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # type: ignore[import-not-found]

    out = []
    for interval in intervals:
        req = Req(rid="r0", origin_input_text="", origin_input_ids=array("q", [5] * 32),
                  sampling_params=SamplingParams(max_new_tokens=output_len), stream=True)  # fmt: skip
        first = output_len
        for position in range(1, output_len + 1):
            req.output_ids.append(7)
            acc = mod._GenerationStreamAccumulator(
                return_logprob=False, return_hidden_states=False, return_routed_experts=False,
                return_indexer_topk=False, spec_algorithm=SpeculativeAlgorithm.NONE,
                disaggregation_mode=DisaggregationMode.NULL, default_stream_interval=interval,
                default_force_stream_interval=50, get_cached_tokens_details=lambda r: None,
                is_request_level_customized_info_key=lambda k: False,
                current_weight_version=None,
            )  # fmt: skip
            acc.accept(req=req)
            if acc.rids:
                first = position
                break
        out.append(first)
    return out


def detok_step_ms(
    mod: ModuleType, tokenizer: Any, requests: int, positions: list[int]
) -> list[float]:
    """CPU ms of `_decode_batch_token_id_output` for one step of `requests` streams, at each
    output position in `positions` (the streams grow one token a step)."""
    manager = object.__new__(mod.DetokenizerManager)
    manager.tokenizer = tokenizer
    manager.decode_status = {}
    manager.vocab_size = len(tokenizer)
    manager.disable_tokenizer_batch_decode = False
    rng = random.Random(0)
    rids = [f"r{i}" for i in range(requests)]
    out, step = [], 0
    for target in positions:
        while step <= target:
            first = step == 0
            recv = SimpleNamespace(
                rids=rids,
                decoded_texts=[""] * requests,
                decode_ids=[
                    [rng.randrange(3, 1024) for _ in range(6 if first else 1)] for _ in rids
                ],
                read_offsets=[5] * requests,
                finished_reasons=[None] * requests,
                no_stop_trim=[False] * requests,
                skip_special_tokens=[True] * requests,
                spaces_between_special_tokens=[True] * requests,
            )
            started = time.process_time()
            manager._decode_batch_token_id_output(recv)
            spent = time.process_time() - started
            step += 1
        out.append(spent * 1e3)
    return out


def logprob_chunk_ms(
    mod: ModuleType, tokenizer: Any, requests: int, positions: list[int], top: int
) -> list[float]:
    """CPU ms of `add_logprob_to_meta_info` for one chunk of each of `requests` streams (one new
    position each, with its top-`top` alternatives and their text), at each position."""
    manager = object.__new__(mod.TokenizerManager)
    manager.tokenizer = tokenizer
    rng = random.Random(0)
    lists = (
        "input_token_logprobs_val input_token_logprobs_idx input_token_logprobs "
        "output_token_logprobs_val output_token_logprobs_idx output_token_logprobs "
        "input_top_logprobs_val input_top_logprobs_idx input_top_logprobs "
        "output_top_logprobs_val output_top_logprobs_idx output_top_logprobs"
    ).split()
    flags = SimpleNamespace(
        return_flat_raw_top_logprobs=False, return_flat_raw_output_top_logprobs=False
    )
    states = [
        SimpleNamespace(obj=flags, input_top_logprobs_scheduler_flat=None, **{k: [] for k in lists})
        for _ in range(requests)
    ]
    out, step = [], 0
    for target in positions:
        while step <= target:
            spent = 0.0
            for state in states:
                state.output_token_logprobs_val.append(-rng.random())
                state.output_token_logprobs_idx.append(rng.randrange(3, 1024))
                state.output_top_logprobs_val.append([-rng.random() for _ in range(top)])
                state.output_top_logprobs_idx.append([rng.randrange(3, 1024) for _ in range(top)])
                started = time.process_time()
                manager.add_logprob_to_meta_info({}, state, top, None, True, finished=False)
                spent += time.process_time() - started
            step += 1
        out.append(spent * 1e3)
    return out


def stream_chunk_ms(
    mod: ModuleType, tokenizer: Any, requests: int, positions: list[int], top: int
) -> list[float]:
    """CPU ms the native endpoint's stream (`serve_generate_request`'s streaming response) spends
    encoding one chunk of each of `requests` streams at each output position in `positions`: the
    cumulative chunk the tokenizer manager hands it for a request with `return_logprob` and
    `top` alternatives (text, output ids, every `(logprob, token_id, None)` entry so far). The
    tokenizer manager is a stand-in that yields the prepared chunks. Best of 5."""
    import asyncio

    from sglang.srt.managers.tokenizer_manager import (  # type: ignore[import-not-found]
        TokenizerManager,
    )

    manager = object.__new__(TokenizerManager)
    rng = random.Random(0)
    chunks: list[dict[str, Any]] = []

    class Manager:  # what the stream asks of the tokenizer manager
        async def generate_request(self, obj: Any, request: Any) -> Any:
            for chunk in chunks:
                yield chunk

        def create_abort_task(self, obj: Any) -> None:
            return None

    mod._global_state = SimpleNamespace(tokenizer_manager=Manager())
    obj = SimpleNamespace(stream=True)

    async def drain() -> None:
        response = await mod.serve_generate_request(obj, None)
        async for _ in response.body_iterator:
            pass

    out = []
    for p in positions:
        chunks.clear()
        for i in range(requests):
            ids = [rng.randrange(3, 1024) for _ in range(p)]
            logprobs = [-rng.random() * 6 for _ in range(p)]
            meta = {
                "id": f"{i:032x}", "finish_reason": None, "prompt_tokens": 32,
                "weight_version": "default", "num_retractions": 0,
                "input_token_logprobs": [],
                "output_token_logprobs": manager.detokenize_logprob_tokens(logprobs, ids, False),
                "output_token_logprobs_length": p, "reasoning_tokens": 0,
                "completion_tokens": p, "cached_tokens": 0,
            }  # fmt: skip
            if top:
                meta["output_top_logprobs"] = [
                    manager.detokenize_logprob_tokens(
                        sorted(-rng.random() * 6 for _ in range(top)),
                        [rng.randrange(3, 1024) for _ in range(top)], False,
                    )
                    for _ in range(p)
                ]  # fmt: skip
            chunks.append({"text": tokenizer.decode(ids), "output_ids": ids, "meta_info": meta})
        best = float("inf")
        for _ in range(5):
            started = time.process_time()
            asyncio.run(drain())
            best = min(best, time.process_time() - started)
        out.append(best * 1e3)
    return out


def priority_pass_ms(mod: ModuleType, queue_lens: list[int]) -> list[float]:
    """CPU ms of one longest-prefix-first priority pass (`SchedulePolicy.calc_priority`) over a
    waiting queue of each length in `queue_lens` (32-token random prompts, an empty cache)."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req  # type: ignore[import-not-found]
    from sglang.srt.mem_cache.radix_cache import RadixCache  # type: ignore[import-not-found]
    from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore[import-not-found]

    # The pass reads two server-wide settings; give it the defaults a plain server runs with.
    mod.get_disagg = lambda: SimpleNamespace(disaggregation_mode="null")
    mod.get_memory = lambda: SimpleNamespace(radix_eviction_policy="lru")
    rng = random.Random(0)
    out = []
    for n in queue_lens:
        queue = [
            Req(
                rid=f"r{i}",
                origin_input_text="",
                origin_input_ids=array("q", (rng.randrange(3, 1024) for _ in range(32))),
                sampling_params=SamplingParams(max_new_tokens=16),
            )
            for i in range(n)
        ]
        policy = mod.SchedulePolicy("lpm", RadixCache.create_simulated(), False, False, False)
        started = time.process_time()
        for _ in range(5):
            policy.calc_priority(list(queue))
        out.append((time.process_time() - started) / 5 * 1e3)
    return out


def bf16_logprob_err_nats(
    requests: int, vocab: int = 1024, std: float = 1.5
) -> tuple[float, float]:
    """Mean and max absolute difference (nats) between the top-5 log-probabilities computed
    from float32 logits and from the same logits rounded to bfloat16 (the logits' type when they
    leave the logits processor unconverted), for `requests` rows of `vocab` logits with the tiny
    model's spread (std 1.5 after the final norm, `serving.tiny_model`)."""
    import torch  # type: ignore[import-not-found]

    logits = torch.randn(requests, vocab, generator=torch.Generator().manual_seed(0)) * std
    exact = torch.log_softmax(logits, dim=-1)
    rounded = torch.log_softmax(logits.to(torch.bfloat16), dim=-1).float()
    top = exact.topk(5, dim=-1).indices
    diff = (exact.gather(1, top) - rounded.gather(1, top)).abs()
    return diff.mean().item(), diff.max().item()


def prefill_release_ms(pools: list[int], batch: int, row: int) -> list[tuple[float, float]]:
    """CPU ms of releasing the KV rows (`row` tokens each) of `batch` requests that finished at
    prefill, with SGLang's `TokenToKVPoolAllocator` of each size in `pools`: (one free group
    around the batch, one free per request). Best of 5."""
    import torch  # type: ignore[import-not-found]
    from sglang.srt.mem_cache.allocator.token import (  # type: ignore[import-not-found]
        TokenToKVPoolAllocator,
    )

    out = []
    for size in pools:
        allocator = TokenToKVPoolAllocator(size, torch.bfloat16, "cpu", None, need_sort=False)
        best = [float("inf"), float("inf")]
        for _ in range(5):
            for grouped in (True, False):
                rows = [allocator.alloc(row) for _ in range(batch)]
                started = time.process_time()
                if grouped:
                    allocator.free_group_begin()
                for indices in rows:
                    allocator.free(indices)
                if grouped:
                    allocator.free_group_end()
                spent = (time.process_time() - started) * 1e3
                best[0 if grouped else 1] = min(best[0 if grouped else 1], spent)
        out.append((best[0], best[1]))
    return out


def sampling_info_build_ms(mod: ModuleType, batches: list[int], banned: int) -> list[float]:
    """CPU ms of `SamplingBatchInfo.from_schedule_batch` for one prefill batch of each size in
    `batches`, every request carrying a logit_bias of -100 on the same `banned` token ids (a
    client's ban list; the tiny model's 1024-token vocabulary). Best of 5."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req  # type: ignore[import-not-found]
    from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore[import-not-found]

    # The builder reads server-wide switches; give it those of a plain CPU server.
    mod.get_exec = lambda: SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=False),
        features=SimpleNamespace(enable_custom_logit_processor=False, enable_watermark=False),
    )

    class Batch:  # the two fields the builder reads (the penalizers keep a weak reference)
        def __init__(self, reqs: list[Any]) -> None:
            self.reqs, self.device = reqs, "cpu"

    ban = {str(t): -100.0 for t in random.Random(0).sample(range(3, 1024), banned)}
    out = []
    for n in batches:
        reqs = [
            Req(rid=f"r{i}", origin_input_text="", origin_input_ids=array("q", [5] * 32),
                sampling_params=SamplingParams(max_new_tokens=4, logit_bias=dict(ban)))
            for i in range(n)
        ]  # fmt: skip
        best = float("inf")
        for _ in range(5):
            started = time.process_time()
            mod.SamplingBatchInfo.from_schedule_batch(Batch(reqs), 1024)
            best = min(best, time.process_time() - started)
        out.append(best * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--positions", default="32,128,512")
    parser.add_argument("--queue-lens", default="64,128,256,512")
    parser.add_argument("--pools", default="32768,131072,524288")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--bias-batches", default="32,128,256")
    parser.add_argument("--banned", type=int, default=512)
    args = parser.parse_args()
    if not (args.tokenizer / "tokenizer.json").is_file():
        sys.exit(f"{args.tokenizer}: no tokenizer.json")
    from transformers import AutoTokenizer  # type: ignore[import-not-found]

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    positions = [int(p) for p in args.positions.split(",")]
    queue_lens = [int(n) for n in args.queue_lens.split(",")]
    runs = [
        ("sglang-real-long-stream-slowdown", "sglang/srt/managers/detokenizer_manager.py",
         "position", positions, lambda m: detok_step_ms(m, tokenizer, args.requests, positions)),
        ("sglang-real-rl-rollout-stall", "sglang/srt/managers/tokenizer_manager.py",
         "position", positions,
         lambda m: logprob_chunk_ms(m, tokenizer, args.requests, positions, 5)),
        ("sglang-real-scored-stream-slowdown", "sglang/srt/entrypoints/http_server.py",
         "position", positions,
         lambda m: stream_chunk_ms(m, tokenizer, args.requests, positions, 5)),
        ("sglang-real-burst-queue-stall", "sglang/srt/managers/schedule_policy.py",
         "queue", queue_lens, lambda m: priority_pass_ms(m, queue_lens)),
    ]  # fmt: skip
    for task, rel, unit, xs, measure in runs:
        clean = measure(module(rel, None))
        fault = measure(module(rel, TASKS / task / "inject.patch"))
        for x, c, f in zip(xs, clean, fault, strict=True):
            print(f"{task}  {unit} {x:5d}  installed {c:8.2f} ms  fault {f:8.2f} ms  "
                  f"ratio {f / c if c else float('nan'):6.1f}x")  # fmt: skip
    pools = [int(n) for n in args.pools.split(",")]
    for pool, (grouped, single) in zip(
        pools, prefill_release_ms(pools, args.batch, 33), strict=True
    ):
        print(f"sglang-real-label-burst-slowdown  pool {pool:7d}  {args.batch} releases: "
              f"grouped {grouped:8.2f} ms  one by one {single:8.2f} ms  "
              f"ratio {single / grouped if grouped else float('nan'):6.1f}x")  # fmt: skip
    rel = "sglang/srt/sampling/sampling_batch_info.py"
    task = "sglang-real-banned-tokens-slowdown"
    bias_batches = [int(n) for n in args.bias_batches.split(",")]
    clean = sampling_info_build_ms(module(rel, None), bias_batches, args.banned)
    fault = sampling_info_build_ms(
        module(rel, TASKS / task / "inject.patch"), bias_batches, args.banned
    )
    for n, c, f in zip(bias_batches, clean, fault, strict=True):
        print(f"{task}  batch {n:4d}  {args.banned} banned tokens each: installed {c:8.2f} ms  "
              f"fault {f:8.2f} ms  ratio {f / c if c else float('nan'):6.1f}x  "
              f"(+{(f - c) / n * 1e3:.0f} us per request)")  # fmt: skip
    mean, worst = bf16_logprob_err_nats(args.requests)
    print(f"sglang-real-rollout-logprob-mismatch  top-5 logprob error of bfloat16 logits: "
          f"mean {mean:.2e} nats, max {worst:.2e} nats (float32 logits: 0)")  # fmt: skip
    rel = "sglang/srt/managers/scheduler_components/output_streamer.py"
    task, intervals = "sglang-real-late-first-token", [1, 2, 4, 8, 16]
    clean = first_chunk_steps(module(rel, None), intervals, 64)
    fault = first_chunk_steps(module(rel, TASKS / task / "inject.patch"), intervals, 64)
    for k, c, f in zip(intervals, clean, fault, strict=True):
        print(f"{task}  stream interval {k:2d}: first chunk at output position "
              f"installed {c:2d}  fault {f:2d}  (+{f - c} decode steps before the first token)")  # fmt: skip


if __name__ == "__main__":
    main()
