"""The decode node's KV cache: fixed-size slots, handed out and taken back through a free list."""

from __future__ import annotations

import threading

import torch


class SlotPool:
    """`num_slots` KV slots of `slot_elems` int64 values each; most recently freed slots first."""

    def __init__(self, num_slots: int, slot_elems: int) -> None:
        self.kv = torch.zeros(num_slots, slot_elems, dtype=torch.int64)
        self._free = list(range(num_slots))
        self._lock = threading.Lock()

    def alloc(self, count: int) -> list[int] | None:
        """`count` free slots, or None when the pool is exhausted."""
        with self._lock:
            if len(self._free) < count:
                return None
            taken = self._free[-count:]
            del self._free[-count:]
            return taken

    def free(self, slots: list[int]) -> None:
        with self._lock:
            self._free.extend(reversed(slots))

    def read(self, slots: list[int]) -> torch.Tensor:
        return self.kv[slots]

    def write(self, slots: list[int], values: torch.Tensor) -> None:
        self.kv[slots] = values
