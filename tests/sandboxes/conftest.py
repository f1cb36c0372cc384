"""Fixtures for sandbox tests: a private Docker engine (one per session) and a sandbox factory
parametrized over both backends, so one contract suite runs against each."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra_agent.sandboxes import Sandbox, SandboxSpec, create_sandbox
from infra_agent.sandboxes.docker_engine import EngineHandle, ensure_engine
from infra_agent.sandboxes.workspace import PREFIX


@pytest.fixture(scope="session")
def docker_engine() -> Iterator[EngineHandle | None]:
    """A private dockerd with the sandbox image, DOCKER_HOST pointing at it for the session
    (None: an engine that already answers on DOCKER_HOST, with the image, is used as it is).

    Skips only when dockerd is not installed; an installed engine that fails to start fails."""
    from infra_agent.sandboxes.container import engine_problem

    if engine_problem() is None:  # an engine with the image already answers on DOCKER_HOST
        yield None
        return
    if shutil.which("dockerd") is None and not os.path.exists("/usr/sbin/dockerd"):
        pytest.skip("dockerd is not installed (run .ci/setup-system.sh)")
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    # named like a sandbox folder, so a run killed by SIGKILL has it swept by the next one
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-engine-"))
    engine = ensure_engine(root)
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
