"""Layer-by-layer asynchronous loading of a request's pages from the host tier to the device.

A load thread copies layer 0, 1, ... into the device buffers and bumps a per-layer "loaded"
counter after each; readers of layer l must wait until the counter passes l. Host-memory copies
take a jittered time and, rarely, stall (contention on the host link).
"""

from __future__ import annotations

import queue
import random
import threading
import time

import torch

from host_cache import HostTier


class LayerLoader:
    def __init__(
        self,
        host: HostTier,
        device_kv: torch.Tensor,
        device_index: torch.Tensor,
        *,
        load_us: float,
        stall_prob: float,
        stall_us: float,
        seed: int,
    ) -> None:
        self.host = host
        self.device_kv = device_kv  # [layers, page_elems], reused by every request
        self.device_index = device_index  # [layers, topk], reused by every request
        self.load_s = load_us / 1e6
        self.stall_prob = stall_prob
        self.stall_s = stall_us / 1e6
        self.seed = seed
        self.loaded = 0  # layers of the current request already on the device
        self.cond = threading.Condition()
        self.spans: list[tuple[str, int, int]] = []  # (name, start ns, end ns)
        self.jobs: queue.Queue[int | None] = queue.Queue()
        self.thread = threading.Thread(target=self._load_loop, name="hicache-load")
        self.thread.start()

    def start(self, request: int) -> None:
        """Begin loading `request`'s layers (the previous request must be finished)."""
        with self.cond:
            self.loaded = 0
        self.jobs.put(request)

    def wait_layer(self, layer: int) -> None:
        """Block until `layer` of the current request is on the device."""
        with self.cond:
            self.cond.wait_for(lambda: self.loaded > layer)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()

    def _load_loop(self) -> None:
        while True:
            request = self.jobs.get()
            if request is None:
                return
            rng = random.Random(hash((self.seed, request)))
            layers = self.device_kv.shape[0]
            stalled = rng.randrange(layers) if rng.random() < self.stall_prob else -1
            for layer in range(layers):
                start = time.perf_counter_ns()
                # The host-to-device copy on the load stream (rarely stalled by host contention).
                copy_s = self.load_s * (0.8 + 0.4 * rng.random())
                time.sleep(copy_s + (self.stall_s if layer == stalled else 0.0))
                self.device_index[layer].copy_(self.host.index[request][layer])
                self.device_kv[layer].copy_(self.host.kv[request][layer])
                self.spans.append((f"load.layer{layer}", start, time.perf_counter_ns()))
                with self.cond:
                    self.loaded = layer + 1
                    self.cond.notify_all()
