"""Where tasks come from: bundled folders, folders given by path, the configured search path, and
third-party packages registering through the `infra_agent.tasks` entry-point group.

An entry point names a function that returns a task folder (or a list of folders):

    [project.entry-points."infra_agent.tasks"]
    my-task = "my_package.tasks:folder"
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.tasks.manifest import MANIFEST_FILENAME, Task, load_task

BUNDLED_DIR = Path(__file__).parent.parent / "bundled_tasks"
"""The tasks that ship with the package: content beside the layers, not a layer (README, Tasks)."""
ENTRY_POINT_GROUP = "infra_agent.tasks"


def _plugin_folders() -> list[Path]:
    folders: list[Path] = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            value = ep.load()()
        except Exception as exc:  # a broken plugin must not hide the other tasks
            raise UserError(f"task plugin '{ep.name}' ({ep.value}) failed to load: {exc}") from exc
        items = value if isinstance(value, list | tuple) else [value]
        folders.extend(Path(v) for v in items)
    return folders


def _candidate_folders(search_path: Iterable[Path] = ()) -> list[Path]:
    """Every folder that may be a task, in precedence order (bundled first)."""
    roots = [BUNDLED_DIR, *search_path]
    folders: list[Path] = []
    for root in roots:
        if (root / MANIFEST_FILENAME).is_file():
            folders.append(root)
        elif root.is_dir():
            folders.extend(sorted(p for p in root.iterdir() if (p / MANIFEST_FILENAME).is_file()))
    return folders + _plugin_folders()


def list_tasks(search_path: Iterable[Path] = ()) -> list[Task]:
    """All tasks found, sorted by name; the first folder wins when two share a name.
    `search_path`: the folders of `settings.tasks.search_path` (the CLI passes them).

    A malformed manifest raises UserError naming the file (a broken task is not hidden)."""
    tasks: dict[str, Task] = {}
    for folder in _candidate_folders(search_path):
        task = load_task(folder)
        tasks.setdefault(task.name, task)
    return sorted(tasks.values(), key=lambda t: t.name)


def find_task(name_or_path: str | Path, search_path: Iterable[Path] = ()) -> Task:
    """A task by folder path, or by name: bundled, in the folders of `search_path` (the
    configured `settings.tasks.search_path`), or from a plugin."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    if (
        "/" in text
        or text.startswith(".")
        or (path.is_dir() and (path / MANIFEST_FILENAME).exists())
    ):
        if not path.exists():
            raise UserError(f"task folder {path}: not found")
        return load_task(path)
    search_path = list(search_path)  # read twice: the folders, then the error's list
    for folder in _candidate_folders(search_path):
        if folder.name == text or _manifest_name(folder) == text:
            task = load_task(folder)
            if task.name == text:
                return task
    known = ", ".join(t.name for t in list_tasks(search_path)) or "none"
    raise UserError(f"unknown task '{text}' (known tasks: {known})")


def _manifest_name(folder: Path) -> str | None:
    try:
        return load_task(folder).name
    except UserError:
        return None
