"""The prefill node: computes a request's KV and writes it into the decode node's slots.

Writes go through a pool of transfer threads standing in for RDMA engines. A write takes a
jittered time on the wire and, rarely, stalls for much longer (a congested link or a retransmit).
Which writes stall is drawn from the seed per request and attempt, never from the machine's speed.
"""

from __future__ import annotations

import queue
import random
import threading
import time

import torch

from kv_pool import SlotPool


def compute_kv(prompt: int, pages: int, slot_elems: int) -> torch.Tensor:
    """The KV of a request in miniature: [pages, slot_elems] int64, a function of its prompt."""
    base = torch.arange(pages * slot_elems, dtype=torch.int64).reshape(pages, slot_elems)
    return base * 1_000_003 + prompt


class Transfer:
    """One request's KV write into decode-side slots."""

    def __init__(self, request: int, prompt: int, slots: list[int], latency_s: float) -> None:
        self.request = request
        self.prompt = prompt
        self.slots = slots
        self.latency_s = latency_s
        self.done = False


class PrefillNode:
    def __init__(
        self,
        pool: SlotPool,
        *,
        writers: int,
        write_us: float,
        stall_prob: float,
        stall_min_ms: float,
        stall_max_ms: float,
        seed: int,
    ) -> None:
        self.pool = pool
        self.write_s = write_us / 1e6
        self.stall_prob = stall_prob
        self.stall_min_s = stall_min_ms / 1e3
        self.stall_max_s = stall_max_ms / 1e3
        self.seed = seed
        self.writers = writers
        self.jobs: queue.Queue[Transfer | None] = queue.Queue()
        self.threads = [
            threading.Thread(target=self._write_loop, name=f"rdma-{i}") for i in range(writers)
        ]
        for thread in self.threads:
            thread.start()

    def transfer(self, request: int, prompt: int, slots: list[int], attempt: int = 0) -> Transfer:
        """Start writing the request's KV into `slots`; poll `.done` for completion."""
        job = Transfer(request, prompt, slots, self._latency(request, attempt))
        self.jobs.put(job)
        return job

    def close(self) -> None:
        """Stop the transfer threads after the writes already queued."""
        for _ in self.threads:
            self.jobs.put(None)
        for thread in self.threads:
            thread.join()

    def _latency(self, request: int, attempt: int) -> float:
        """Wire time of one write: exponential jitter, or a heavy-tailed (Pareto 1.2) stall."""
        rng = random.Random(hash((self.seed, request, attempt)))
        if rng.random() < self.stall_prob:
            return min(self.stall_max_s, self.stall_min_s * rng.random() ** (-1 / 1.2))
        return rng.expovariate(1.0 / self.write_s)

    def _write_loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            time.sleep(job.latency_s)
            self.pool.write(job.slots, compute_kv(job.prompt, len(job.slots), self.pool.kv.shape[1]))
            job.done = True
