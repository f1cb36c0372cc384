"""Fixtures for sandbox tests: a sandbox factory parametrized over both backends, so one contract
suite runs against each (the session's private Docker engine is tests/conftest.py's
`docker_engine`, shared with the experiment tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra_agent.sandboxes import Sandbox, SandboxSpec, create_sandbox


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_engine")
    return str(request.param)


SandboxFactory = Callable[..., Sandbox]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    (ws / "kernel.py").write_text("def f(x):\n    return x + 1\n")
    (ws / "data").mkdir()
    (ws / "data" / "input.txt").write_text("42\n")
    return ws


@pytest.fixture
def make_sandbox(backend: str, workspace: Path) -> Iterator[SandboxFactory]:
    """make_sandbox(**spec_fields) -> a sandbox of the parametrized backend, cleaned after."""
    made: list[Sandbox] = []

    def make(ws: Path | None = None, **fields: object) -> Sandbox:
        sandbox = create_sandbox(backend, ws or workspace, SandboxSpec(**fields))  # type: ignore[arg-type]
        made.append(sandbox)
        return sandbox

    yield make
    for sandbox in made:
        sandbox.cleanup()
