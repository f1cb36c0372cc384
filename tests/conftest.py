"""Shared fixtures: every test gets its own run store, so no test touches the user's. And the
suite's tiers and grouping:

- a test marked `long` runs only with INFRA_AGENT_LONG_TESTS=1 (CI does not set it; README,
  "Tests", lists what the long tier covers);
- under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`) each test file is one group, so
  a module-scoped fixture (a server, a browser) is made once, and the tests on the docker
  backend form one, so the session's private dockerd starts once;
- the files that start real SGLang servers run first (the longest groups first: a 10-minute
  file handed out last would leave the other worker idle).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from infra_agent.sandboxes.docker_engine import EngineHandle


LONG_TESTS = os.environ.get("INFRA_AGENT_LONG_TESTS") == "1"
"""Whether the long tier runs (tests marked `long`: measured effects, minutes-long end-to-end
runs; see README, "Tests")."""


def xdist_group(item: pytest.Item) -> str:
    """The group an xdist worker runs as a whole: "docker" for tests on the docker backend or
    marked `docker` (those that start engines of their own and count the engine folders left),
    "tiny-looks" for those sharing tests/serving/conftest.py's look server, else the test's
    file."""
    if "tiny_looks" in getattr(item, "fixturenames", ()):
        return "tiny-looks"
    callspec = getattr(item, "callspec", None)
    on_docker = callspec is not None and callspec.params.get("backend") == "docker"
    if on_docker or item.get_closest_marker("docker") is not None:
        return "docker"
    return item.path.relative_to(item.config.rootpath).as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_long = pytest.mark.skip(reason="long tier: set INFRA_AGENT_LONG_TESTS=1 to run it")
    serving = {item.path for item in items if item.get_closest_marker("sglang") is not None}
    items.sort(key=lambda item: item.path not in serving)  # stable: files stay whole, in order
    for item in items:
        if item.get_closest_marker("long") is not None and not LONG_TESTS:
            item.add_marker(skip_long)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


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
