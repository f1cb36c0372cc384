"""The front end's cost of handing a batch request to the scheduler, without a server (the
sglang-real-batch-request-slowdown task's fault): SGLang 0.5.23's own request types, pickled
through a ZMQ PUSH/PULL pair as its processes do, as one message for the batch (installed) and
one message per prompt (the fault).

    ~/.cache/infra-agent/sglang-0.5.23-venv/bin/python benchmarks/bench_sglang_batch_dispatch.py \
        [--batches 16,64,256]

(run with SGLang's interpreter: it imports the installed `sglang`). Prints, per batch size, the
CPU milliseconds of both and their ratio. The task's symptom is not this work but what it does
to admission: the scheduler finds the first prompts of a batch alone and runs them in a step of
their own; that part is the server's to show (the task's README).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any


def batch_dispatch_ms(sizes: list[int]) -> list[tuple[float, float]]:
    """CPU ms of handing one batch request's token-id prompts (32 ids, 4 new tokens each) from
    the front end to the scheduler over a ZMQ PUSH/PULL pair, as SGLang's processes do: pickle,
    send, receive and unpickle, for each size in `sizes`: (one `BatchTokenizedGenerateReqInput`
    message, the installed path; one `TokenizedGenerateReqInput` message per prompt, the path
    with the fault). Best of 5. The pieces the scheduler then admits the batch in are the
    server's to show."""
    from array import array

    import zmq  # type: ignore[import-not-found]
    from sglang.srt.managers import io_struct  # type: ignore[import-not-found]
    from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore[import-not-found]

    def prompt(i: int) -> Any:
        return io_struct.TokenizedGenerateReqInput(
            rid=f"r{i}", input_text=None, input_ids=array("q", range(i, i + 32)),
            input_embeds=None, mm_inputs=None, token_type_ids=None,
            sampling_params=SamplingParams(max_new_tokens=4), return_logprob=False,
            logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=True,
        )  # fmt: skip

    context = zmq.Context()
    with tempfile.TemporaryDirectory(prefix="bench-zmq-") as scratch:
        pull = context.socket(zmq.PULL)
        pull.bind(f"ipc://{scratch}/s")
        push = context.socket(zmq.PUSH)
        push.connect(f"ipc://{scratch}/s")
        out = []
        for n in sizes:
            prompts = [prompt(i) for i in range(n)]
            best = [float("inf"), float("inf")]
            for _ in range(5):
                for one_message in (True, False):
                    messages = (
                        [io_struct.BatchTokenizedGenerateReqInput(batch=prompts)]
                        if one_message
                        else prompts
                    )
                    started = time.process_time()
                    for message in messages:
                        push.send_pyobj(message)
                    for _ in messages:
                        pull.recv_pyobj()
                    spent = (time.process_time() - started) * 1e3
                    best[0 if one_message else 1] = min(best[0 if one_message else 1], spent)
            out.append((best[0], best[1]))
        push.close(linger=0)
        pull.close(linger=0)
    context.term()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="16,64,256")
    args = parser.parse_args()
    sizes = [int(n) for n in args.batches.split(",")]
    for n, (one, each) in zip(sizes, batch_dispatch_ms(sizes), strict=True):
        print(f"batch {n:4d}  front end -> scheduler: 1 message {one:8.2f} ms  "
              f"{n} messages {each:8.2f} ms  ratio {each / one if one else float('nan'):6.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
