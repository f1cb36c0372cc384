"""The decode node's scheduler: admits requests, waits for their KV, decodes, and aborts requests
whose KV transfer times out (they are retried through the load balancer)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

from kv_pool import SlotPool
from prefill import PrefillNode, Transfer


@dataclass
class Running:
    transfer: Transfer
    started: float
    steps: int = 0


class DecodeScheduler:
    def __init__(
        self,
        pool: SlotPool,
        prefill: PrefillNode,
        *,
        pages: int,
        concurrency: int,
        timeout_ms: float,
        decode_steps: int,
        step_us: float,
    ) -> None:
        self.pool = pool
        self.prefill = prefill
        self.pages = pages
        self.concurrency = concurrency
        self.timeout_s = timeout_ms / 1e3
        self.decode_steps = decode_steps
        self.step_s = step_us / 1e6
        self.aborts = 0

    def abort(self, run: Running) -> None:
        """The KV did not arrive in time: cancel the request and give its slots back."""
        self.aborts += 1
        self.pool.free(run.transfer.slots)

    def serve(self, prompts: list[int]) -> torch.Tensor:
        """Serve every prompt; returns each request's output (a checksum of the KV it decoded
        from), in request order. Timed-out requests are retried with new slots."""
        outputs = torch.zeros(len(prompts), dtype=torch.int64)
        weights = torch.arange(1, self.pool.kv.shape[1] + 1, dtype=torch.int64)
        waiting = deque(range(len(prompts)))
        attempts = [0] * len(prompts)
        running: dict[int, Running] = {}
        while waiting or running:
            while waiting and len(running) < self.concurrency:
                slots = self.pool.alloc(self.pages)
                if slots is None:
                    break
                request = waiting.popleft()
                transfer = self.prefill.transfer(request, prompts[request], slots, attempts[request])
                running[request] = Running(transfer, time.perf_counter())
            now = time.perf_counter()
            for request, run in list(running.items()):
                if not run.transfer.done:
                    if now - run.started > self.timeout_s:
                        self.abort(run)
                        del running[request]
                        attempts[request] += 1
                        waiting.append(request)
                    continue
                run.steps += 1
                if run.steps >= self.decode_steps:
                    kv = self.pool.read(run.transfer.slots)
                    outputs[request] = int((kv * weights).sum())
                    self.pool.free(run.transfer.slots)
                    del running[request]
            time.sleep(self.step_s)  # one decode forward step
        return outputs
