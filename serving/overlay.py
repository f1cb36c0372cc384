"""Source patches to SGLang itself, through a private PYTHONPATH overlay.

A serving task's workspace may hold copies of SGLang modules at their package paths (e.g.
`workspace/sglang/srt/layers/sampler.py`, listed in the task's `editable`). A candidate patch
edits those copies like any workspace file. When an arm's server starts, `build_overlay` compares
each such file with the installed SGLang's; if any differs it copies the installed `sglang`
package into a private folder of that arm, writes the changed modules over it, and returns the
folder (hard links to the installed files, real files for the changed modules), which the
server gets first on its PYTHONPATH (every SGLang process, spawned children
included, imports the patched package). The installed SGLang is never modified and each arm has
its own copy, so two candidates never see each other's change.

`add_module(workspace, "sglang/srt/x.py")` copies a module from the installed package into a
task workspace (how a task author makes a module editable).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.serving.env import SGLANG_VERSION, ensure_sglang_env, env_python

_PACKAGE_DIRS: dict[str, Path] = {}


def installed_package(version: str = SGLANG_VERSION) -> Path:
    """The installed `sglang` package folder of the cached environment."""
    if version not in _PACKAGE_DIRS:
        python = env_python(ensure_sglang_env(version))
        code = (
            "import importlib.util as u; print(u.find_spec('sglang').submodule_search_locations[0])"
        )
        proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise UserError(
                f"cannot locate the installed sglang package: {proc.stderr.strip()[-200:]}"
            )
        _PACKAGE_DIRS[version] = Path(proc.stdout.strip())
    return _PACKAGE_DIRS[version]


def _installed_file(relpath: str, version: str) -> Path:
    if not relpath.startswith("sglang/") or ".." in Path(relpath).parts:
        raise UserError(f"overlay file {relpath!r} must be a path inside the sglang package")
    path = installed_package(version).parent / relpath
    if not path.is_file():
        raise UserError(f"SGLang {version} has no module {relpath}")
    return path


def changed_modules(workspace: Path, files: list[str], version: str = SGLANG_VERSION) -> list[str]:
    """The overlay files whose workspace copy differs from the installed module."""
    changed = []
    for rel in files:
        mine = workspace / rel
        if not mine.is_file():
            raise UserError(f"overlay file {rel} is missing from the workspace")
        if mine.read_bytes() != _installed_file(rel, version).read_bytes():
            changed.append(rel)
    return changed


def build_overlay(
    workspace: Path, files: list[str], dest: Path, version: str = SGLANG_VERSION
) -> Path | None:
    """A private copy of the sglang package with the workspace's changed modules, or None when
    nothing differs (the server then imports the installed package)."""
    changed = changed_modules(workspace, files, version)
    if not changed:
        return None
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(
        installed_package(version), dest / "sglang", ignore=shutil.ignore_patterns("__pycache__")
    )
    for rel in changed:
        shutil.copyfile(workspace / rel, dest / rel)
    return dest


def add_module(workspace: Path, relpath: str, version: str = SGLANG_VERSION) -> Path:
    """Copy an installed SGLang module into a task workspace so patches may edit it."""
    target = workspace / relpath
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_installed_file(relpath, version), target)
    return target
