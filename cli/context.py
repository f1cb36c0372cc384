"""Per-invocation state shared by the commands: the effective settings and the run store.

Only the `cli` package reads it: a command passes what the library needs (a search path, a
policy, a size limit, the settings themselves) down as arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra_agent.config import Settings, load_settings
from infra_agent.errors import UserError
from infra_agent.store import RunStore, open_store


@dataclass
class Invocation:
    config_path: Path | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    debug: bool = False
    resume_run: Callable[[Path, str], None] | None = None
    """Resumes the run (id) of the store (path) waiting for review, for the review queue: the CLI
    wires in the agent's runner here, so review never imports the agent."""
    _settings: Settings | None = None
    _store: RunStore | None = None

    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_path, self.overrides)
        return self._settings

    def store(self, *, readonly: bool = False) -> RunStore:
        """Open the configured run store (read-only commands don't create it)."""
        if self._store is None:
            self._store = open_store(self.settings().store.path(), readonly=readonly)
        return self._store

    def store_path(self) -> Path:
        return self.settings().store.path()

    def task_search_path(self) -> list[Path]:
        """The configured task folders (`tasks.search_path`); none where the configuration does
        not load, so that `tasks list` and `tasks show` work beside a broken file."""
        try:
            return list(self.settings().tasks.search_path)
        except UserError:
            return []


_current = Invocation()


def current() -> Invocation:
    return _current


def reset(invocation: Invocation) -> None:
    global _current
    _current = invocation
