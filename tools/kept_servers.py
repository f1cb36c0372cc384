"""The servers a run keeps between looks: a small cache by key, the least recently used stopped.

It knows nothing of how a server starts (the caller passes `start`), so the tool context can
own it without importing the instruments that start servers (`tools.looks`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


class Kept(Protocol):
    def alive(self) -> bool: ...

    def close(self) -> None: ...


K = TypeVar("K", bound=Kept)

KEPT_SERVERS = 3
"""Look servers kept at once (each holds a model in memory); the least recently used goes."""


@dataclass
class KeptServers(Generic[K]):
    """Servers by key, most recently used last."""

    keep: int = KEPT_SERVERS
    servers: dict[str, K] = field(default_factory=dict)

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
            self.servers[key] = start()
            return self.servers[key], False
        self.servers[key] = found
        return found, True

    def close(self) -> None:
        """Stop every kept server (the run ended)."""
        while self.servers:
            self.servers.pop(next(iter(self.servers))).close()
