"""Fixtures for the verification core's tests: a fast pure-Python task (no torch), patch
builders, a switch that turns the static rules off (to test the run-time defences behind them),
and the sandbox backends this machine can run."""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra_agent.experiments import rules
from infra_agent.tasks.manifest import Task, load_task
from infra_agent.tasks.patch import Patch, parse_diff

PYTASK = Path(__file__).parent / "pytask"


def make_diff(task: Task, relpath: str, new_text: str) -> str:
    """A unified diff turning the task's workspace file `relpath` into `new_text`."""
    path = task.workspace / relpath
    old = path.read_text().splitlines(keepends=True) if path.exists() else []
    lines = difflib.unified_diff(
        old,
        new_text.splitlines(keepends=True),
        fromfile=f"a/{relpath}" if old else "/dev/null",
        tofile=f"b/{relpath}",
    )
    return "".join(lines)


def patch_for(task: Task, relpath: str, new_text: str, **provenance: str) -> Patch:
    return parse_diff(make_diff(task, relpath, new_text), **provenance)


@pytest.fixture
def make_patch() -> Callable[..., Patch]:
    """make_patch(task, relpath, new_text, author=..., rationale=...) -> a diff Patch."""
    return patch_for


@pytest.fixture
def pytask(tmp_path: Path) -> Callable[..., Task]:
    """pytask(allow=[...], **budget) -> a fresh copy of the test task with those settings."""

    def make(allow: list[str] | None = None, **budget: Any) -> Task:
        folder = tmp_path / f"pytask-{len(list(tmp_path.glob('pytask-*')))}"
        shutil.copytree(PYTASK, folder)
        toml = folder / "task.toml"
        text = toml.read_text()
        if allow:
            text = text.replace(
                "min_effect = 0.05", f"min_effect = 0.05\nallow = {allow!r}".replace("'", '"')
            )
        for key, value in budget.items():
            lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
            index = lines.index("[budget]")
            lines.insert(index + 1, f"{key} = {value!r}")
            text = "\n".join(lines) + "\n"
        toml.write_text(text)
        return load_task(folder)

    return make


@pytest.fixture
def no_static_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn the static stage off, so a cheat reaches the run-time defences."""
    monkeypatch.setattr(rules, "new_violations", lambda *args, **kwargs: [])


@pytest.fixture(scope="session")
def docker_ready() -> Iterator[None]:
    """A docker engine for the docker backend: one already answering (DOCKER_HOST), else a
    private dockerd started here. Skips only when dockerd is not installed or we are not root."""
    from infra_agent.sandboxes.container import engine_problem

    if engine_problem() is None:
        yield
        return
    if shutil.which("dockerd") is None and not os.path.exists("/usr/sbin/dockerd"):
        pytest.skip("dockerd is not installed (run .ci/setup-system.sh)")
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    from infra_agent.sandboxes.docker_engine import ensure_engine

    engine = ensure_engine(Path(tempfile.mkdtemp(prefix="iad-engine-")))
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = engine.base_url
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous
        engine.stop()


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_ready")
    return str(request.param)
