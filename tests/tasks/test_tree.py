"""The workspace tree: an installed package as a serving task's workspace, with the task's
injected fault in it and hidden from the agent, and no SGLang module vendored under tasks/."""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.serving.env import find_sglang_env
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.patch import PatchError, parse_diff
from infra_agent.tasks.registry import BUNDLED_DIR, find_task
from infra_agent.tasks.tree import preview_apply, workspace_folder, workspace_tree

needs_sglang = pytest.mark.skipif(
    find_sglang_env() is None,
    reason="SGLang environment not created (python -m infra_agent.serving.env --ensure)",
)
SAMPLER = "sglang/srt/layers/sampler.py"
TASK_FOLDERS = (BUNDLED_DIR.parent / "tasks", BUNDLED_DIR)
"""The task layer's code and the bundled task folders."""


def installed_root() -> Path:
    from infra_agent.serving.overlay import installed_package

    return installed_package().parent


def injected_task(tmp_path: Path, marker: str = "INJECTED_MARK") -> Path:
    """A copy of sglang-cpu-tiny with an inject.patch adding one line to the sampler."""
    folder = tmp_path / "mine"
    shutil.copytree(find_task("sglang-cpu-tiny").root, folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('name = "sglang-cpu-tiny"', 'name = "mine"'))
    lines = (installed_root() / SAMPLER).read_text().splitlines(keepends=True)
    (folder / "inject.patch").write_text(
        f"--- a/{SAMPLER}\n+++ b/{SAMPLER}\n@@ -1,3 +1,4 @@\n"
        + f" {lines[0]}+{marker} = 1\n"
        + "".join(" " + line for line in lines[1:3])
    )
    return folder


@needs_sglang
def test_the_installed_package_is_the_serving_workspace() -> None:
    tree = workspace_tree(find_task("sglang-cpu-tiny"))
    files = tree.files()
    assert len(files) > 1000 and all(name.startswith("sglang/") for name in files)
    assert "sglang/srt/managers/scheduler.py" in files
    assert not any("__pycache__" in name for name in files)
    assert tree.read_bytes(SAMPLER) == (installed_root() / SAMPLER).read_bytes()
    for outside in ("../sglang-0.5.23.dist-info/RECORD", "/etc/passwd", "sglang/../../x"):
        assert not tree.inside(outside)


@needs_sglang
def test_an_injected_fault_is_part_of_the_tree_and_hidden(tmp_path: Path) -> None:
    task = load_task(injected_task(tmp_path))
    tree = workspace_tree(task)
    assert "INJECTED_MARK = 1" in tree.read_text(SAMPLER)
    assert "INJECTED_MARK" not in (installed_root() / SAMPLER).read_text()  # install untouched
    assert not tree.inside("../inject.patch") and not tree.inside("inject.patch")
    plain = workspace_tree(find_task("sglang-cpu-tiny"))
    assert tree.fingerprint() != plain.fingerprint()
    # A sandbox gets the injected file, and the files a patch touches, nothing else.
    with workspace_folder(task, ["sglang/srt/server_args.py"]) as folder:
        got = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        assert got == ["sglang/srt/layers/sampler.py", "sglang/srt/server_args.py"]
        assert "INJECTED_MARK = 1" in (folder / SAMPLER).read_text()
    assert not folder.exists()


@needs_sglang
def test_patches_are_diffs_against_the_injected_tree(tmp_path: Path) -> None:
    task = load_task(injected_task(tmp_path))
    lines = (installed_root() / SAMPLER).read_text().splitlines(keepends=True)
    fix = parse_diff(
        f"--- a/{SAMPLER}\n+++ b/{SAMPLER}\n@@ -1,4 +1,3 @@\n"
        + f" {lines[0]}-INJECTED_MARK = 1\n"
        + "".join(" " + line for line in lines[1:3])
    )
    scratch = preview_apply(fix, task)
    try:
        assert (scratch / "ws" / SAMPLER).read_bytes() == (installed_root() / SAMPLER).read_bytes()
    finally:
        shutil.rmtree(scratch)
    # The same diff does not apply to the un-injected tree.
    with pytest.raises(PatchError, match="does not apply"):
        preview_apply(fix, find_task("sglang-cpu-tiny"))
    missing = parse_diff("--- a/sglang/nope.py\n+++ b/sglang/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="does not exist"):
        preview_apply(missing, task)


@needs_sglang
def test_an_injection_that_does_not_apply_is_a_clear_error(tmp_path: Path) -> None:
    folder = injected_task(tmp_path)
    (folder / "inject.patch").write_text(
        f"--- a/{SAMPLER}\n+++ b/{SAMPLER}\n@@ -1,1 +1,1 @@\n-not in the file\n+x\n"
    )
    with pytest.raises(UserError, match="inject.patch: does not apply to the installed package"):
        workspace_tree(load_task(folder)).files()


def test_a_package_task_has_no_workspace_folder_and_a_pinned_version(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    shutil.copytree(find_task("sglang-cpu-tiny").root, folder)
    (folder / "workspace").mkdir()
    (folder / "workspace" / "x.py").write_text("")
    with pytest.raises(UserError, match="workspace/ folder beside it would be ignored"):
        load_task(folder)
    shutil.rmtree(folder / "workspace")
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('version = "0.5.23"\n', ""))
    with pytest.raises(UserError, match="needs the version"):
        load_task(folder)


def _installed_modules() -> tuple[set[str], dict[str, str], dict[str, set[str]]]:
    """sha256 of every installed SGLang source file, each module's text, and for each long line
    the modules holding it."""
    digests: set[str] = set()
    texts: dict[str, str] = {}
    holders: dict[str, set[str]] = {}
    for path in (installed_root() / "sglang").rglob("*"):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        digests.add(hashlib.sha256(data).hexdigest())
        if path.suffix == ".py":
            rel = path.relative_to(installed_root()).as_posix()
            texts[rel] = data.decode(errors="replace")
            for line in set(texts[rel].splitlines()):
                if len(line.strip()) > 40:
                    holders.setdefault(line.strip(), set()).add(rel)
    return digests, texts, holders


@needs_sglang
def test_nothing_under_tasks_is_a_copy_of_an_installed_sglang_module() -> None:
    digests, _, holders = _installed_modules()
    for path in sorted(p for folder in TASK_FOLDERS for p in folder.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(BUNDLED_DIR.parent)
        assert "sglang" not in rel.parts[1:-1] or rel.parts[0] != BUNDLED_DIR.name, (
            f"{rel}: vendored"
        )
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() not in digests, f"{rel} is an installed module"
        if path.suffix != ".py":
            continue  # patches quote a few lines of context; a module would be .py
        lines = [line.strip() for line in data.decode(errors="replace").splitlines()]
        long_lines = [line for line in lines if len(line) > 40]
        shared = Counter(module for line in long_lines for module in holders.get(line, ()))
        if shared and long_lines:
            module, count = shared.most_common(1)[0]
            assert count < max(20, len(long_lines) // 2), f"{rel} is a near-copy of {module}"
