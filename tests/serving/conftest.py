"""Fixtures for the serving tests: one run's tool context on the embedded default target, shared
by the live `server_steps` and `server_profile` tests so that they look at one baseline server
(a look server is kept for the run, `tools.looks`: the second look costs its workload, not a
server start of 40-60 s on a 2-core machine)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext


@pytest.fixture(scope="session")
def tiny_looks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolContext]:
    """A run's tool context on sglang-cpu-tiny; its look servers stop when the session ends."""
    folder = tmp_path_factory.mktemp("tiny-looks")
    ctx = ToolContext(task=find_task("sglang-cpu-tiny"), store=open_store(folder / "runs.db"),
                      run_id="r")  # fmt: skip
    yield ctx
    ctx.close()
