"""Task registry: bundled tasks, folders by path, the search path, entry points, bad manifests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.tasks import registry
from infra_agent.tasks.registry import find_task, list_tasks

EXAMPLE = registry.BUNDLED_DIR / "example-matmul"


def copy_task(dest: Path, name: str) -> Path:
    shutil.copytree(EXAMPLE, dest)
    toml = dest / "task.toml"
    toml.write_text(toml.read_text().replace('name = "example-matmul"', f'name = "{name}"'))
    return dest


def test_bundled_example_is_listed_and_found() -> None:
    names = [t.name for t in list_tasks(search_path=[])]
    assert "example-matmul" in names
    task = find_task("example-matmul", search_path=[])
    assert task.workspace.is_dir() and task.reference_patch is not None
    assert task.manifest.metric.name == "latency_ms"


def test_folder_by_path_and_search_path(tmp_path: Path) -> None:
    folder = copy_task(tmp_path / "tasks" / "mine", "my-task")
    assert find_task(str(folder)).name == "my-task"
    assert find_task("my-task", search_path=[tmp_path / "tasks"]).root == folder.resolve()
    assert "my-task" in [t.name for t in list_tasks(search_path=[tmp_path / "tasks"])]


def test_entry_point_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = copy_task(tmp_path / "plugin-task", "plugin-task")

    class EntryPoint:
        name, value = "plugin", "pkg:folder"

        def load(self):  # noqa: ANN202
            return lambda: folder

    monkeypatch.setattr(registry, "entry_points", lambda group: [EntryPoint()])
    assert find_task("plugin-task", search_path=[]).root == folder.resolve()


def test_unknown_and_malformed(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown task 'nope'.*example-matmul"):
        find_task("nope", search_path=[])
    bad = copy_task(tmp_path / "bad", "bad")
    (bad / "task.toml").write_text(
        (bad / "task.toml").read_text().replace('objective = "latency"', 'objective = "speed"')
    )
    with pytest.raises(UserError, match=r"task.toml: field 'objective'"):
        find_task(str(bad))
    (bad / "task.toml").write_text("name = [")
    with pytest.raises(UserError, match="not valid TOML"):
        list_tasks(search_path=[tmp_path])
    with pytest.raises(UserError, match="not found"):
        find_task(str(tmp_path / "missing"))


def test_an_empty_workspace_is_refused(tmp_path: Path) -> None:
    """git keeps no empty folder: a task whose workspace/ has no files would vanish from a clone."""
    folder = copy_task(tmp_path / "empty", "empty")
    shutil.rmtree(folder / "workspace")
    (folder / "workspace" / "sub").mkdir(parents=True)
    with pytest.raises(UserError, match="workspace/ has no files"):
        find_task(str(folder))


def test_every_bundled_task_is_tracked_by_git() -> None:
    """Each bundled task loads from the files git tracks, as on a clean clone in CI."""
    tracked = subprocess.run(
        ["git", "ls-files", "--", "."],
        cwd=registry.BUNDLED_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    files = set(tracked.stdout.split())
    for task in list_tasks(search_path=[]):
        if task.root.parent != registry.BUNDLED_DIR.resolve():
            continue
        prefix = f"{task.name}/"
        for needed in ("task.toml", task.manifest.harness):
            assert prefix + needed in files, f"{prefix}{needed} is not tracked by git"
        if task.manifest.workspace.package is not None:  # an installed package is the code
            assert not any(f.startswith(prefix + "workspace/") for f in files), task.name
            continue
        assert any(f.startswith(prefix + "workspace/") for f in files), (
            f"{task.name}: no workspace/ file is tracked by git"
        )


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str):
    """`infra-agent ARGS` through the console entry point, in this process (the CLI's imports
    are paid once; the subprocess path is covered by tests/test_cli.py)."""
    from infra_agent.cli import main

    monkeypatch.setattr(sys, "argv", ["infra-agent", *args])
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out, err)


def test_cli_list_and_show(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import json

    def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return run_main(monkeypatch, capsys, *args)

    listed = run_cli("tasks", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert (
        rows["example-matmul"]["unit"] == "ms"
        and rows["example-matmul"]["higher_is_better"] is False
    )
    shown = run_cli("tasks", "show", "example-matmul", "--json")
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert (
        detail["manifest"]["editable"] == ["projection.py"] and "example-matmul" in detail["readme"]
    )
    missing = run_cli("tasks", "show", "no-such-task")
    assert missing.returncode == 2 and missing.stderr.startswith(
        "error: unknown task 'no-such-task'"
    )
    assert missing.stdout == ""


def test_no_story_shows_a_placeholder() -> None:
    """Stories are shown to the model as written: a '{num_prompts}' left in one (seen by a model
    through the relay) reads as a broken task."""
    import re

    for task in list_tasks(search_path=[]):
        for text in (task.manifest.title, task.manifest.story):
            assert not re.search(r"\{[A-Za-z_]+\}", text), f"{task.name}: {text}"


def test_the_configured_search_path_comes_from_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """`tasks.search_path` in the configuration reaches the registry as an argument from the
    command; the registry itself reads no configuration (a name on the search path is unknown
    to a library call that does not pass it)."""
    import json

    copy_task(tmp_path / "tasks" / "mine", "my-task")
    config = tmp_path / "infra-agent.toml"
    config.write_text(f'[tasks]\nsearch_path = ["{tmp_path / "tasks"}"]\n')
    listed = run_main(monkeypatch, capsys, "--config", str(config), "tasks", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "my-task" in [row["name"] for row in json.loads(listed.stdout)]
    shown = run_main(monkeypatch, capsys, "--config", str(config), "tasks", "show", "my-task")
    assert shown.returncode == 0 and "my-task" in shown.stdout, shown.stderr
    monkeypatch.chdir(tmp_path)  # where a configuration file would be found by default
    with pytest.raises(UserError, match="unknown task 'my-task'"):
        find_task("my-task")
