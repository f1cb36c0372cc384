"""What a dotted name in candidate code refers to, found without importing anything.

`queue.threading.Thread` is `threading.Thread` (queue.py does `import threading`), `os.path` is
`posixpath`, `concurrent.futures` is a submodule. The static rules read names through this, so a
module reached as another module's attribute is judged as itself. Modules are located with the
import system's path finder (no module is imported, no code runs) and their source is parsed for
the names their import statements bind; modules without source (built-in, extension) bind none.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from importlib.machinery import ModuleSpec, PathFinder

MAX_CHAIN = 8
"""How many module hops one name may take (`a.b.c...`): enough for any real chain."""


@lru_cache(maxsize=1024)
def _spec(name: str) -> ModuleSpec | None:
    """The spec of module `name`, found on the harness's sys.path without importing it (nor its
    parent packages)."""
    parts = name.split(".")
    try:
        spec = PathFinder.find_spec(parts[0])
        for i in range(1, len(parts)):
            locations = spec.submodule_search_locations if spec is not None else None
            if not locations:
                return None
            spec = PathFinder.find_spec(".".join(parts[: i + 1]), list(locations))
    except (ImportError, ValueError, OSError, KeyError):  # KeyError: a namespace package's
        return None  # path finder looks its parent up in sys.modules (not imported here)
    return spec


def is_module(name: str) -> bool:
    """True if `name` names a module or package that exists here (built-in ones included)."""
    import sys

    if name in sys.builtin_module_names or name in sys.modules:
        return True
    return _spec(name) is not None


@lru_cache(maxsize=1024)
def bindings(module: str) -> dict[str, str]:
    """Names `module`'s own import statements bind at its top level (also inside if/try/with),
    each to the dotted name it refers to: {'threading': 'threading', 'path': 'posixpath',
    'Thread': 'threading.Thread'}."""
    spec = _spec(module)
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return {}
    try:
        with open(origin, encoding="utf-8", errors="replace") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return {}
    package = (
        module
        if spec is not None and spec.submodule_search_locations
        else module.rpartition(".")[0]
    )
    found: dict[str, str] = {}
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    found[top] = top
        elif isinstance(stmt, ast.ImportFrom):
            base = stmt.module or ""
            if stmt.level:
                parts = package.split(".")
                anchor = ".".join(parts[: len(parts) - stmt.level + 1])
                base = f"{anchor}.{base}".strip(".")
            for alias in stmt.names:
                if alias.name != "*":
                    found[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(stmt, ast.If | ast.Try | ast.With):
            for field in ("body", "orelse", "finalbody"):
                stack.extend(getattr(stmt, field, []))
            for handler in getattr(stmt, "handlers", []):
                stack.extend(handler.body)
    return found


@lru_cache(maxsize=4096)
def canonical(name: str) -> str:
    """`name` with every module reached through another module's attribute replaced by that
    module's own name ('queue.threading.Thread' -> 'threading.Thread'). Parts that are not
    modules, or that cannot be followed, are kept as written."""
    parts = name.split(".")
    for _ in range(MAX_CHAIN):
        changed = False
        for i in range(1, len(parts)):
            head, attr = ".".join(parts[:i]), parts[i]
            if not is_module(head):
                break
            target = bindings(head).get(attr)
            if target is not None and target != f"{head}.{attr}":
                parts = target.split(".") + parts[i + 1 :]
                changed = True
                break
        if not changed:
            return ".".join(parts)
    return ".".join(parts)
