"""Source changes to SGLang itself, through a private PYTHONPATH overlay.

A serving task's workspace is the installed `sglang` package (`tasks.tree`): an arm's sandbox
holds only the modules that differ from it or that a patch touches, at their package paths
(`sglang/srt/layers/sampler.py`). When the arm's server starts, `build_overlay` compares each
with the installed module; if any differs it builds a private `sglang` folder for that arm in
which the changed modules are real files and everything else is a symbolic link into the
installed package (folders on the way to a changed module are real folders of links), and
returns its parent, which the server gets first on its PYTHONPATH: every SGLang process, spawned
children included, imports the changed package, with the installed package's bytecode caches
for every module that did not change. The installed SGLang is never modified, and each arm has
its own overlay, so two candidates never see each other's change.

The overlay alone would leave each changed module's original in the installed package, where
served code finds it (`sglang.__file__`'s neighbours, the site-packages path) and a failed
request's error text could carry it back: for an injected task that is the hidden fault's
un-injected original. `served_view` lists what the server's file view binds instead: each
changed module over its installed original, and the originals' bytecode caches hidden, so the
only copy of the package a confined server can read is the one it serves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.serving.env import SGLANG_VERSION, ensure_sglang_env, env_python

_PACKAGE_DIRS: dict[str, Path] = {}


def installed_package(version: str = SGLANG_VERSION) -> Path:
    """The installed `sglang` package folder of the cached environment (created on first use)."""
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


def _check(relpath: str) -> None:
    parts = Path(relpath).parts
    if not parts or parts[0] != "sglang" or ".." in parts or Path(relpath).is_absolute():
        raise UserError(f"overlay file {relpath!r} must be a path inside the sglang package")


def changed_modules(workspace: Path, files: list[str], version: str = SGLANG_VERSION) -> list[str]:
    """The workspace files that differ from the installed package (new files included)."""
    root = installed_package(version).parent
    changed = []
    for rel in files:
        _check(rel)
        mine = workspace / rel
        if not mine.is_file():
            raise UserError(f"overlay file {rel} is missing from the workspace")
        installed = root / rel
        if not installed.is_file() or mine.read_bytes() != installed.read_bytes():
            changed.append(rel)
    return changed


def build_overlay(
    workspace: Path, files: list[str], dest: Path, version: str = SGLANG_VERSION
) -> Path | None:
    """A private `sglang` package under `dest` with the workspace's changed modules, or None
    when nothing differs (the server then imports the installed package)."""
    changed = changed_modules(workspace, files, version)
    if not changed:
        return None
    if dest.exists():
        shutil.rmtree(dest)
    package = installed_package(version)
    _link_farm(
        package,
        dest / "sglang",
        {str(Path(rel).relative_to("sglang")): workspace / rel for rel in changed},
    )
    return dest


def served_view(
    overlay: Path, version: str = SGLANG_VERSION
) -> tuple[dict[Path, Path], list[Path]]:
    """(installed module -> the overlay's changed file bound over it, the installed bytecode
    caches of those modules, to hide) for an overlay made by `build_overlay`."""
    installed = installed_package(version).parent
    replaced: dict[Path, Path] = {}
    caches: list[Path] = []
    for folder, dirs, files in os.walk(overlay / "sglang"):  # links to folders are not entered
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            changed = Path(folder) / name
            original = installed / changed.relative_to(overlay)
            if changed.is_symlink() or not original.is_file():
                continue  # unchanged (a link), or new: no original to cover
            replaced[original] = changed
            cache = original.parent / "__pycache__"
            if cache.is_dir():
                stem = original.name.rsplit(".", 1)[0]
                caches += sorted(p for p in cache.iterdir() if p.name.split(".", 1)[0] == stem)
    return replaced, caches


def _link_farm(source: Path, dest: Path, changed: dict[str, Path]) -> None:
    """`dest` mirrors `source` by symbolic links except along the paths in `changed`
    (relative path -> new content): there real folders and the new files. A real folder's
    `__pycache__` is a real folder of links to the caches of its unchanged modules, so Python
    never writes a changed module's bytecode into the installed package."""
    dest.mkdir(parents=True)
    heads: dict[str, dict[str, Path]] = {}
    for rel, content in changed.items():
        head, _, rest = rel.partition("/")
        heads.setdefault(head, {})[rest] = content
    stale = {Path(rel).stem for rel in changed if "/" not in rel}
    if source.is_dir():
        for entry in sorted(source.iterdir()):
            if entry.name in heads:
                continue
            if entry.name == "__pycache__":
                cache = dest / "__pycache__"
                cache.mkdir()
                for pyc in entry.iterdir():
                    if pyc.name.split(".", 1)[0] not in stale:
                        os.symlink(pyc, cache / pyc.name)
                continue
            os.symlink(entry, dest / entry.name)
    for head, below in heads.items():
        if "" in below:  # a file directly in this folder
            shutil.copyfile(below[""], dest / head)
        else:
            _link_farm(source / head, dest / head, below)
