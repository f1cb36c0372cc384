"""The first message carries what the model needs to start: the task description, its success
criteria, the workspace tree (bounded) and small editable files inline, under a size cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra_agent.agent import prompts
from infra_agent.agent.prompts import task_message
from infra_agent.agent.state import Budget
from infra_agent.serving.env import find_sglang_env
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.registry import find_task, list_tasks
from infra_agent.tasks.tree import WorkspaceTree
from infra_agent.tools.patching import published_workload, task_description

CAP = 14_000
"""The first message's size in characters at most (about 3,500 tokens), whatever the task."""


def first(task: Task) -> str:
    return task_message(task, "throughput", Budget(), "f" * 64, {})


def test_decode_split_norm_starts_with_the_task_the_tree_and_the_code() -> None:
    task = find_task("decode-split-norm")
    text = first(task)
    assert task_description(task.manifest) in text  # what describe_task returns, once
    assert task.manifest.story.strip() in text
    assert "- target step_time_ms at least 1.5x better than baseline" in text
    assert "attention.py  (editable)" in text and "decode_server.py  (editable)" in text
    for name in ("attention.py", "decode_server.py"):
        assert (task.workspace / name).read_text().rstrip() in text
    assert "Start with describe_task" not in text
    assert published_workload(task, {}).startswith("workload: ")  # the shapes it measures
    assert published_workload(task, {}) in text
    assert len(text) < CAP


def test_large_editable_files_are_named_not_inlined(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prompts, "INLINE_CHARS", 1000)
    task = find_task("decode-split-norm")
    text = first(task)
    assert (task.workspace / "decode_server.py").read_text().rstrip() in text  # 923 chars: fits
    assert "def split_decode_attention" not in text
    assert "Not inline (over 1000 chars in all; read_file): attention.py (" in text


def test_a_serving_task_shows_its_package_by_folder_under_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A serving task's workspace is the whole installed SGLang package (thousands of files):
    the message names the editable globs and the top-level folders, and no file's text."""
    root = tmp_path / "site"
    for k in range(3000):
        path = root / "sglang" / f"area{k % 90}" / f"sub{k % 7}" / f"mod{k}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n" * 50)
    (root / "sglang" / "__init__.py").write_text("")
    tree = WorkspaceTree(root=root, top="sglang")
    monkeypatch.setattr(prompts, "workspace_tree", lambda task: tree)
    task = find_task("sglang-cpu-tiny")
    text = first(task)
    assert "package, 3001 files (3001 editable: sglang/**/*.py)" in text
    assert "sglang/__init__.py" in text and "sglang/area0/  (34 files)" in text
    assert "... and 31 more (list_files)" in text  # 91 entries, 60 shown
    assert "x = 1" not in text
    assert len(text) < CAP


def test_every_bundled_task_starts_under_the_cap() -> None:
    """Serving tasks only where the SGLang environment is complete: reading the package's tree
    otherwise installs it (never from a test; the fake package above covers the shape)."""
    ready = find_sglang_env() is not None
    for task in list_tasks():
        if task.manifest.workspace.package is not None and not ready:
            continue
        text = first(task)
        assert task.manifest.story.strip()[:80] in text, task.name
        assert len(text) < CAP, (task.name, len(text))
