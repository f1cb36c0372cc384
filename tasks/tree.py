"""A task's workspace tree: the files the agent reads and a patch may change.

Either the task's own `workspace/` folder, or an installed package named in the manifest
(`[workspace] package = "sglang"`, `version = "0.5.23"`): the whole package as installed in the
environment its target runs in, read where it is installed, with the task's `inject.patch` (a
fault, hidden like reference.patch) applied on top. The agent sees one tree in which the fault is
part of the package; patches are diffs against that tree, with paths like
`sglang/srt/layers/sampler.py`. Nothing of the package is copied into the task folder.

    tree = workspace_tree(task)
    tree.files()                               # sorted paths
    tree.read_text("sglang/srt/layers/x.py")   # the injected content where the fault is
    with workspace_folder(task, patch.files) as folder:   # what a sandbox copies
        ...
    scratch = preview_apply(patch, task)       # the patch applied to a private copy

For a package, `workspace_folder` is sparse: the injected files and the files a patch touches,
at their package paths (a serving harness overlays exactly those on the installed package).
Where a package is installed is asked of the `infra_agent.workspace_packages` entry points
(name = "module:function", the function takes the version and returns the package folder);
infra-agent registers `sglang`.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import (
    Patch,
    PatchError,
    apply_patch,
    git_apply,
    parse_diff,
    parse_files,
)

PACKAGE_GROUP = "infra_agent.workspace_packages"
SKIPPED_DIRS = {"__pycache__", ".git"}


@dataclass(frozen=True)
class WorkspaceTree:
    """Read-only files under `root`; `top` limits them to one entry of it (a package folder);
    `injected` holds the baseline content of the files a task's fault changes."""

    root: Path
    top: str | None = None
    injected: dict[str, bytes] = field(default_factory=dict)
    identity: str = ""
    """What the files are when they are not hashed one by one (a package, its version, the
    digest of its RECORD)."""

    def _path(self, rel: str) -> Path | None:
        parts = Path(rel).parts
        if not parts or Path(rel).is_absolute() or ".." in parts:
            return None
        if self.top is not None and parts[0] != self.top:
            return None
        path = self.root / rel
        base = (self.root / self.top) if self.top else self.root
        try:
            path.resolve().relative_to(base.resolve())
        except ValueError:
            return None  # a link out of the tree
        return path

    def inside(self, rel: str) -> bool:
        """Whether `rel` names a path of this tree (no '..', not absolute, no link out)."""
        return rel in self.injected or self._path(rel) is not None

    def is_file(self, rel: str) -> bool:
        if rel in self.injected:
            return True
        path = self._path(rel)
        return path is not None and path.is_file()

    def read_bytes(self, rel: str) -> bytes:
        if rel in self.injected:
            return self.injected[rel]
        path = self._path(rel)
        if path is None or not path.is_file():
            raise UserError(f"no file '{rel}' in the workspace")
        return path.read_bytes()

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode(errors="replace")

    def files(self) -> list[str]:
        """Every file, sorted (caches and VCS folders left out). A package's listing is read
        once per process (it does not change under a running task); a task folder's each time."""
        if self.top is None:
            return list(_listing.__wrapped__(self.root, None, ()))
        return list(_listing(self.root, self.top, tuple(sorted(self.injected))))

    def checkout(self, dest: Path, files: Iterable[str] = ()) -> None:
        """Write a writable copy to `dest`: the whole tree for a task folder; for a package, the
        injected files and `files` (those that exist) at their paths."""
        if self.top is None and not self.injected:
            shutil.copytree(self.root, dest, symlinks=True)
            return
        dest.mkdir(parents=True, exist_ok=True)
        for rel in sorted(set(self.injected) | set(files)):
            if not self.is_file(rel):
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.read_bytes(rel))

    def fingerprint(self) -> str:
        """sha256 over the tree's content (a package by its identity and the injected files)."""
        digest = hashlib.sha256(self.identity.encode() + b"\0")
        names = sorted(self.injected) if self.identity else self.files()
        for rel in names:
            digest.update(rel.encode() + b"\0" + self.read_bytes(rel) + b"\0")
        return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def _listing(root: Path, top: str | None, injected: tuple[str, ...]) -> tuple[str, ...]:
    start = root / top if top else root
    names = set(injected)
    for path in start.rglob("*"):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts) or not path.is_file():
            continue
        names.add(rel.as_posix())
    return tuple(sorted(names))


def package_locator(name: str) -> Callable[[str], Path]:
    """The registered function that finds where package `name` is installed."""
    for ep in entry_points(group=PACKAGE_GROUP):
        if ep.name == name:
            try:
                found: Callable[[str], Path] = ep.load()
            except Exception as exc:  # a broken plugin: say which
                raise UserError(f"package locator '{name}' ({ep.value}) fails: {exc}") from exc
            return found
    known = ", ".join(sorted(ep.name for ep in entry_points(group=PACKAGE_GROUP))) or "none"
    raise UserError(
        f"no installed-package workspace named '{name}' (registered: {known}; entry-point group "
        f"{PACKAGE_GROUP})"
    )


def workspace_tree(task: Task) -> WorkspaceTree:
    """The task's workspace as the agent and a baseline arm see it."""
    spec = task.manifest.workspace
    if spec.package is None:
        return WorkspaceTree(root=task.workspace.resolve())
    assert spec.version is not None
    inject = task.inject_patch
    return _package_tree(
        spec.package,
        spec.version,
        inject.read_text() if inject is not None else "",
        str(inject) if inject is not None else "",
    )


@functools.lru_cache(maxsize=16)
def _package_tree(package: str, version: str, inject: str, source: str) -> WorkspaceTree:
    folder = Path(package_locator(package)(version)).resolve()
    root = folder.parent
    record = next(iter(sorted(root.glob(f"{package}-{version}.dist-info/RECORD"))), None)
    identity = f"{package}=={version}\0" + (
        hashlib.sha256(record.read_bytes()).hexdigest() if record is not None else "no RECORD"
    )
    tree = WorkspaceTree(root=root, top=folder.name, identity=identity)
    if not inject:
        return tree
    return WorkspaceTree(
        root=root, top=folder.name, injected=_inject(tree, inject, source), identity=identity
    )


def _inject(tree: WorkspaceTree, diff: str, source: str) -> dict[str, bytes]:
    """The content of the files `diff` changes, after applying it to the installed ones."""
    try:
        changes = parse_files(diff)
    except PatchError as exc:
        raise UserError(f"{source}: {exc}") from exc
    files = sorted({p for change in changes for p in change.paths()})
    with tempfile.TemporaryDirectory(prefix="infra-agent-inject-") as tmp:
        work = Path(tmp)
        tree.checkout(work, files)
        result = git_apply(diff, work, check=False)
        if result.returncode != 0:
            why = (result.stderr.strip().splitlines() or ["git apply failed"])[0]
            raise UserError(
                f"{source}: does not apply to the installed package ({why}); it was written "
                "against another version"
            )
        return {rel: (work / rel).read_bytes() for rel in files if (work / rel).is_file()}


@contextmanager
def workspace_folder(task: Task, files: Iterable[str] = ()) -> Iterator[Path]:
    """A folder holding the task's baseline workspace for a sandbox to copy: the task's own
    workspace/ as it is, or a private sparse copy of a package tree (injected files and
    `files`), removed afterwards."""
    tree = workspace_tree(task)
    if tree.top is None:
        yield tree.root
        return
    tmp = Path(tempfile.mkdtemp(prefix="infra-agent-ws-"))
    try:
        tree.checkout(tmp / "ws", files)
        yield tmp / "ws"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def preview_apply(patch: Patch, task: Task) -> Path:
    """Apply `patch` to a private temporary copy of the task's workspace; the caller removes the
    returned folder (the patched tree is its `ws/`). Used to check a patch before any sandbox
    exists."""
    tmp = Path(tempfile.mkdtemp(prefix="infra-agent-patch-"))
    try:
        workspace_tree(task).checkout(tmp / "ws", patch.files)
        apply_patch(patch, task, tmp / "ws")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


def uninjected_patch(task: Task) -> Patch | None:
    """The task's injected fault taken out: a diff from the baseline tree back to the installed
    package (the un-injected engine as a candidate, for measuring a fault's symptom). None for a
    task without an injected fault. Never shown to the agent."""
    tree = workspace_tree(task)
    if not tree.injected:
        return None
    chunks = []
    for rel in sorted(tree.injected):
        installed = tree.root / rel
        before = tree.read_text(rel).splitlines(keepends=True)
        after = installed.read_text().splitlines(keepends=True) if installed.is_file() else []
        chunks.append(
            "".join(
                difflib.unified_diff(
                    before, after, f"a/{rel}", f"b/{rel}" if after else "/dev/null"
                )
            )
        )
    return parse_diff("".join(chunks), author="tasks check", rationale="the un-injected engine")
