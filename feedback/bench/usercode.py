"""Load user code named on a command line: `package.module:function` or `path/to/file.py:function`.

Used by every feedback instrument's CLI and by the benchmark worker process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra_agent.errors import UserError


def load_callable(spec: str) -> Callable[..., Any]:
    """Resolve `module:function` or `file.py:function` (dotted attributes allowed after ':')."""
    if ":" not in spec:
        raise UserError(f"expected 'module:function' or 'file.py:function', got {spec!r}")
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise UserError(f"expected 'module:function' or 'file.py:function', got {spec!r}")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise UserError(f"no such Python file: {where}")
        name = f"_infra_agent_user_{abs(hash(path.resolve()))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise UserError(f"cannot import {where}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        # The file's own folder first, so it can import its siblings.
        sys.path.insert(0, str(path.resolve().parent))
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise UserError(f"importing {where} failed: {type(exc).__name__}: {exc}") from exc
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # a user's module: its import error is theirs to read
            raise UserError(f"cannot import module {where!r}: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{where} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{spec} is not callable")
    return obj
