"""The per-step cost of the sglang-real tasks' faults, without a server: SGLang 0.5.23's own
functions, as installed and with the task's inject.patch applied, timed on the tiny model's
tokenizer as an output grows.

    ~/.cache/infra-agent/sglang-0.5.23-venv/bin/python benchmarks/bench_sglang_real_faults.py \
        --tokenizer FOLDER [--requests 16] [--positions 32,128,512]

(run with SGLang's interpreter: it imports the installed `sglang`; FOLDER holds the tiny model's
tokenizer, e.g. written by `infra_agent.serving.tiny_model.write_tiny_model`). Prints, per task
and output position, the CPU milliseconds of one streamed step for `--requests` requests with the
installed code and with the fault, and their ratio. A step here is only the faulty function's
work (detokenizing one step's outputs; converting one chunk's logprobs), not a server's whole
step: the ratio says how the fault's work grows, the task's experiment says what it costs.
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

TASKS = Path(__file__).resolve().parent.parent / "tasks" / "bundled"
PACKAGE = Path(sglang.__file__).parent.parent


def module(rel: str, patch: Path | None) -> ModuleType:
    """`rel` (e.g. sglang/srt/managers/x.py) as installed, or with `patch` applied, imported
    under a private name."""
    source = PACKAGE / rel
    if patch is not None:
        scratch = Path(tempfile.mkdtemp(prefix="bench-sglang-real-"))
        (scratch / rel).parent.mkdir(parents=True)
        (scratch / rel).write_bytes(source.read_bytes())
        subprocess.run(["patch", "-s", "-p1", "-d", str(scratch), "-i", str(patch)], check=True)
        source = scratch / rel
    name = f"bench_{rel.replace('/', '_').removesuffix('.py')}_{'fault' if patch else 'installed'}"
    spec = importlib.util.spec_from_file_location(name, source)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--positions", default="32,128,512")
    args = parser.parse_args()
    if not (args.tokenizer / "tokenizer.json").is_file():
        sys.exit(f"{args.tokenizer}: no tokenizer.json")
    from transformers import AutoTokenizer  # type: ignore[import-not-found]

    tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    positions = [int(p) for p in args.positions.split(",")]
    runs = [
        ("sglang-real-long-stream-slowdown", "sglang/srt/managers/detokenizer_manager.py",
         lambda m: detok_step_ms(m, tokenizer, args.requests, positions)),
        ("sglang-real-rl-rollout-stall", "sglang/srt/managers/tokenizer_manager.py",
         lambda m: logprob_chunk_ms(m, tokenizer, args.requests, positions, 5)),
    ]  # fmt: skip
    for task, rel, measure in runs:
        clean = measure(module(rel, None))
        fault = measure(module(rel, TASKS / task / "inject.patch"))
        for pos, c, f in zip(positions, clean, fault, strict=True):
            print(f"{task}  position {pos:5d}  installed {c:8.2f} ms  fault {f:8.2f} ms  "
                  f"ratio {f / c if c else float('nan'):6.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
