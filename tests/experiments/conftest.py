"""Fixtures for the verification core's tests: a fast pure-Python task (no torch), patch
builders, a switch that turns the static rules off (to test the run-time defences behind them),
and the sandbox backends this machine can run (docker through the session's shared engine)."""

from __future__ import annotations

import difflib
import shutil
from collections.abc import Callable
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


@pytest.fixture(params=["local", "docker"])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "docker":
        request.getfixturevalue("docker_engine")  # tests/conftest.py: one per session
    return str(request.param)
