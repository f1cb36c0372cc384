"""Shared fixtures: every test gets its own run store, so no test touches the user's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from infra_agent.sandboxes.docker_engine import EngineHandle


@pytest.fixture(autouse=True)
def _isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("infra-agent-home")
    monkeypatch.setenv("INFRA_AGENT_HOME", str(home))
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "INFRA_AGENT_DB", "INFRA_AGENT_LLM_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    yield home


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[EngineHandle | None]:
    """One Docker engine for the whole session, shared by every test folder that needs the
    docker backend: an engine that already answers on DOCKER_HOST with the sandbox image (then
    None), else a private dockerd started by `ensure_engine`, with DOCKER_HOST pointing at it
    until the session ends (then its EngineHandle).

    Skips only when dockerd is not installed or we are not root; an installed engine that fails
    to start fails the tests that need it."""
    import os
    import shutil

    from infra_agent.sandboxes.container import engine_problem
    from infra_agent.sandboxes.docker_engine import engine_root, ensure_engine

    if engine_problem() is None:
        yield None
        return
    if shutil.which("dockerd") is None and not os.path.exists("/usr/sbin/dockerd"):
        pytest.skip("dockerd is not installed (run .ci/setup-system.sh)")
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    engine = ensure_engine(engine_root())
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = engine.base_url
    try:
        yield engine
    finally:
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous
        engine.stop()
