"""Task suites named in TOML (`suites.toml` beside this module, or a file of the user's)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import tomllib

from infra_agent.errors import UserError

BUNDLED = Path(__file__).with_name("suites.toml")


def load_suites(path: Path = BUNDLED) -> dict[str, list[str]]:
    """Suite name -> task references, with `@other` entries expanded."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"suites file {path}: {exc}") from exc
    raw = data.get("suites")
    if not isinstance(raw, dict):
        raise UserError(f"suites file {path}: no [suites.NAME] tables")
    out: dict[str, list[str]] = {}

    def expand(name: str, seen: tuple[str, ...]) -> list[str]:
        if name in seen:
            raise UserError(f"suites file {path}: suite '{name}' includes itself")
        entry = raw.get(name)
        tasks = entry.get("tasks") if isinstance(entry, dict) else None
        if not isinstance(tasks, list) or not all(isinstance(t, str) for t in tasks):
            raise UserError(f"suites file {path}: suite '{name}' needs tasks = [\"...\"]")
        found: list[str] = []
        for t in tasks:
            for item in expand(t[1:], (*seen, name)) if t.startswith("@") else [t]:
                if item not in found:
                    found.append(item)
        return found

    for name in raw:
        out[name] = expand(name, ())
    return out


def resolve(
    refs: list[str], suites_file: Path | None = None, search_path: Iterable[Path] = ()
) -> tuple[str, list[str]]:
    """`--suite` arguments -> (suite label, task references). Each argument is a suite name or a
    task; the tasks are checked to exist (by name also in `search_path`, the configured
    `settings.tasks.search_path`) before anything is recorded."""
    from infra_agent.tasks.registry import find_task

    if not refs:
        raise UserError("--suite: name a suite (seed, sglang, all) or one or more tasks")
    suites = load_suites(suites_file or BUNDLED)
    tasks: list[str] = []
    for ref in refs:
        for item in suites.get(ref, [ref]):
            if item not in tasks:
                tasks.append(item)
    for item in tasks:
        find_task(item, search_path)  # raises UserError naming the unknown task
    label = refs[0] if len(refs) == 1 and refs[0] in suites else ",".join(refs)
    return label, tasks
