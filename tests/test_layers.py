"""The package's import graph, read from the source (function-local imports included, imports
under `if TYPE_CHECKING:` left out since they never run): no loop among modules, and no folder
imports a folder above it. The `cli` folder holds every command: it is the floor every command
stands on, at the top of the order, may import any folder, and nothing in the package imports it
(the entry point and the tests do)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    "store", "judgement", "sandboxes", "feedback", "tasks", "serving", "experiments", "review", "tools",
    "agent", "evals", "trajectories", "cli",
]  # fmt: skip
"""Bottom to top: a folder imports only folders before it (and the root's plain modules)."""


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "benchmarks", "bundled_tasks", "build", ".venv"):
            continue
        if any(part.startswith(".") or part.endswith(".egg-info") for part in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(["infra_agent", *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `name` imports (`from pkg import sub` is an import of pkg.sub)."""
    tree = ast.parse(path.read_text())
    skipped = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("infra_agent") and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def loops(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def folder(name: str) -> str | None:
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or name.endswith(tuple(f".{f}" for f in LAYERS)) else None


def is_command(name: str) -> bool:
    return name == "infra_agent.cli" or name.startswith("infra_agent.cli.")


def test_no_module_imports_itself_through_others() -> None:
    assert loops(graph()) == []


def test_no_folder_imports_a_folder_above_it() -> None:
    upward = []
    for name, targets in graph().items():
        source = folder(name)
        if source is None:
            continue
        assert source in LAYERS, f"folder {source} has no place in LAYERS"
        for target in targets:
            dest = folder(target)
            if dest is not None and dest != source and LAYERS.index(dest) > LAYERS.index(source):
                upward.append(f"{name} -> {target}")
    assert upward == []


def test_only_the_command_floor_holds_commands() -> None:
    """Every command lives in `cli/`: no module elsewhere is a `cli`, and none imports one."""
    names = graph()
    stray = [name for name in names if name.rpartition(".")[2] == "cli" and not is_command(name)]
    assert stray == []
    callers = [
        f"{name} -> {target}"
        for name, targets in names.items()
        if not is_command(name)
        for target in targets
        if is_command(target)
    ]
    assert callers == []


def test_the_checks_can_fail() -> None:
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []
    assert (
        folder("infra_agent.serving.server") == "serving" and folder("infra_agent.errors") is None
    )
    assert is_command("infra_agent.cli.review") and not is_command("infra_agent.review.queue")
    assert not is_command("infra_agent.review.cli") and not is_command("infra_agent.client")
