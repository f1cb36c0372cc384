"""Shared fixtures: every test gets its own run store, so no test touches the user's. And the
suite's tiers and grouping:

- a test marked `long` runs only with INFRA_AGENT_LONG_TESTS=1 (CI does not set it; README,
  "Tests", lists what the long tier covers);
- under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`) each test file is one group, so
  a module-scoped fixture (a server, a browser) is made once; the tests on the docker backend
  form one, so the session's private dockerd starts once; and the tests that use one of the
  shared SGLang servers of tests/serving/conftest.py form one per server, kept next to each
  other (also without xdist), so that server starts once;
- the files that start real SGLang servers run first (the longest groups first: a 10-minute
  file handed out last would leave the other worker idle).

pytest-xdist 3.8 groups by a suffix it writes into each test's node id, which pytest 9.2 no
longer reads (pytest-xdist issue 1386): every test is then dealt out alone and each worker
starts its own copy of a shared server. pyproject.toml keeps pytest below 9.2, and a run whose
groups did not take stops at collection, saying so.
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


SHARED_SERVERS = {"tiny_looks": "tiny-looks", "tiny_baseline": "tiny-baseline"}
"""Fixtures of tests/serving/conftest.py holding a server for the run -> the group of the tests
that use it."""


def shared_server_group(item: pytest.Item) -> str | None:
    """The group of the shared server `item` uses, if any."""
    names = getattr(item, "fixturenames", ())
    return next((group for name, group in SHARED_SERVERS.items() if name in names), None)


def xdist_group(item: pytest.Item) -> str:
    """The group an xdist worker runs as a whole: "docker" for tests on the docker backend or
    marked `docker` (those that start engines of their own and count the engine folders left),
    "tiny-looks" and "tiny-baseline" for those sharing a server of tests/serving/conftest.py,
    else the test's file."""
    shared = shared_server_group(item)
    if shared is not None:
        return shared
    callspec = getattr(item, "callspec", None)
    on_docker = callspec is not None and callspec.params.get("backend") == "docker"
    if on_docker or item.get_closest_marker("docker") is not None:
        return "docker"
    return item.path.relative_to(item.config.rootpath).as_posix()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_long = pytest.mark.skip(reason="long tier: set INFRA_AGENT_LONG_TESTS=1 to run it")
    serving = {item.path for item in items if item.get_closest_marker("sglang") is not None}
    # Stable: files stay whole and in order, except that the users of a shared server move up
    # to the first of them (without xdist too, the server then starts once).
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        first.setdefault(shared_server_group(item) or item.nodeid, index)
    items.sort(
        key=lambda item: (
            item.path not in serving,
            first[shared_server_group(item) or item.nodeid],
        )
    )
    for item in items:
        if item.get_closest_marker("long") is not None and not LONG_TESTS:
            item.add_marker(skip_long)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item)))


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook, in the controller
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """Stop a run whose groups did not take (every test id of a grouped run ends in @group)."""
    config = getattr(node, "config", None)
    if config is not None and config.getvalue("dist") == "loadgroup":
        if any("@" not in nodeid for nodeid in ids):
            pytest.exit(
                f"pytest {pytest.__version__} with this pytest-xdist does not group tests "
                "(pytest-xdist issue 1386): each shared SGLang server would start once per "
                "test. Run `make setup` (it installs pytest below 9.2), or run without -n.",
                returncode=pytest.ExitCode.USAGE_ERROR,
            )


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
