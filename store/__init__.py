"""The run store: typed records of runs, steps, experiments, proposals and decisions in SQLite."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.store":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.store")

from pathlib import Path  # noqa: E402

from infra_agent.store.base import RunStore  # noqa: E402
from infra_agent.store.sqlite import SQLiteRunStore  # noqa: E402


def open_store(path: Path | str, *, readonly: bool = False) -> RunStore:
    """Open the run store at `path` (a SQLite file; created unless `readonly`)."""
    return SQLiteRunStore(path, readonly=readonly)


__all__ = ["RunStore", "SQLiteRunStore", "open_store"]
