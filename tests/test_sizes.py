"""The size limits that keep each piece readable in one sitting (issue 36): no module over 400
lines, and no function over 80 lines outside the command floor (`cli/`, whose commands declare
their options in their signatures). Tests, benchmarks and the bundled task folders are left out,
as in test_layers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("tests", "benchmarks", "bundled_tasks", "build", ".venv"):
            continue
        if any(part.startswith(".") or part.endswith(".egg-info") for part in rel.parts):
            continue
        found.append(path)
    return found


def over_limits(path: Path, text: str) -> list[str]:
    """Each module or function in `text` (the file at `path`) longer than its limit."""
    rel = path.relative_to(ROOT)
    found = []
    lines = len(text.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{rel}: {lines} lines")
    if rel.parts[0] == "cli":
        return found
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_is_over_its_limit() -> None:
    assert [hit for path in sources() for hit in over_limits(path, path.read_text())] == []


def test_the_check_can_fail() -> None:
    long_function = "def f():\n" + "\n".join(f"    x = {i}" for i in range(80))
    assert over_limits(ROOT / "serving" / "x.py", long_function) == ["serving/x.py:1 f: 81 lines"]
    assert over_limits(ROOT / "cli" / "x.py", long_function) == []
    assert over_limits(ROOT / "cli" / "x.py", "\n" * 401) == ["cli/x.py: 401 lines"]
    assert over_limits(ROOT / "x.py", "\n" * 400) == []
    assert str(ROOT / "serving" / "server.py") in {str(p) for p in sources()}
