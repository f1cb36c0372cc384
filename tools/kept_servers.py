"""The servers a run keeps between looks: a small cache by key, the least recently used stopped.

It knows nothing of how a server starts (the caller passes `start`), so the tool context can
own it without importing the instruments that start servers (`tools.looks`).

Kept servers are paused, but each holds its model and three Python processes in memory: before a
server starts (a look's, or an experiment's two), `make_room` stops the least recently used ones
while the machine has less memory available than the new servers need. Four attempts on one
24 GiB machine, each keeping its looks' servers through an experiment, ran out of memory and the
kernel killed an experiment's baseline server (measured 2026-12-05).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar


class Kept(Protocol):
    def alive(self) -> bool: ...

    def close(self) -> None: ...


K = TypeVar("K", bound=Kept)

KEPT_SERVERS = 3
"""Look servers kept at once (each holds a model in memory); the least recently used goes."""

SERVER_MEMORY = 2_500 * 2**20
"""Bytes a server start should find available: a sglang-cpu-tiny server held 2.1 GiB (scheduler
0.9, launcher 0.63, detokenizer 0.59 GiB RSS, measured under load); more for a bigger model."""


def available_memory() -> int | None:
    """MemAvailable in bytes (Linux), None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class KeptServers(Generic[K]):
    """Servers by key, most recently used last."""

    keep: int = KEPT_SERVERS
    servers: dict[str, K] = field(default_factory=dict)
    memory: Callable[[], int | None] = available_memory
    """Bytes the machine has available now (a test gives its own)."""

    def get(self, key: str, start: Callable[[], K]) -> tuple[K, bool]:
        """The server for `key`, started now by `start` or kept from an earlier call (then
        True); a kept one that died is started again."""
        found = self.servers.pop(key, None)
        if found is not None and not found.alive():
            found.close()
            found = None
        if found is None:
            while len(self.servers) >= self.keep:  # make room before a start, not after
                self.servers.pop(next(iter(self.servers))).close()
            self.make_room(SERVER_MEMORY)
            self.servers[key] = start()
            return self.servers[key], False
        self.servers[key] = found
        return found, True

    def make_room(self, need: int) -> int:
        """Stop kept servers, least recently used first, while the machine has under `need`
        bytes available; returns how many were stopped. Unknown memory stops none."""
        stopped = 0
        while self.servers and (free := self.memory()) is not None and free < need:
            self.servers.pop(next(iter(self.servers))).close()
            stopped += 1
        return stopped

    def close(self) -> None:
        """Stop every kept server (the run ended)."""
        while self.servers:
            self.servers.pop(next(iter(self.servers))).close()
