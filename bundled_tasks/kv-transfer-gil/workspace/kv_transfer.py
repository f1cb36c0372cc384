"""The KV-transfer worker thread: ships finished KV pages to the decode side, chunk by chunk.

Each chunk is a copy into the decode node's receive buffer (needs the GIL briefly) followed by
the network write's completion wait on the NIC, which does not hold the GIL (`time.sleep` stands
in for it).
"""

from __future__ import annotations

import queue
import threading
import time

import torch


class KVTransferWorker:
    """Background thread that ships one step's KV chunks per submitted job."""

    def __init__(self, received: torch.Tensor, chunk_wait_us: int) -> None:
        self.received = received  # [steps, chunks, elems]: the decode side's receive buffer
        self.chunk_wait_s = chunk_wait_us / 1e6
        self.jobs: queue.Queue[tuple[int, torch.Tensor] | None] = queue.Queue()
        self.done: queue.Queue[int] = queue.Queue()
        self.thread = threading.Thread(target=self._transfer_loop, name="kv-transfer", daemon=True)
        self.thread.start()

    def submit(self, step: int, pages: torch.Tensor) -> None:
        """Ship `pages` [chunks, elems] as step `step`'s KV."""
        self.jobs.put((step, pages))

    def wait(self) -> int:
        """Block until the oldest submitted step's transfer finished; returns its step index."""
        return self.done.get()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _transfer_loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            step, pages = job
            for chunk in range(pages.shape[0]):
                self.received[step, chunk].copy_(pages[chunk])
                time.sleep(self.chunk_wait_s)
            self.done.put(step)
