"""Static rules: constructs a candidate patch may not introduce, found by reading its code.

Cheapest stage of the cascade after the patch applies. Each rule belongs to a group; a task's
manifest may `allow` a group its code legitimately needs (e.g. `threads`, or `state` for code that
keeps caches or pools between calls, see state_rules). Two groups can never be
allowed: `harness` (reaching the harness, the package, files outside the workspace, secrets) and
`timers` (replacing clocks or monkeypatching modules).

Only constructs the patch *adds* count: a rule hit already present in the baseline file is not
the candidate's doing.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass

from infra_agent.experiments.state_rules import scan_state

GROUPS = {
    "network": "network access (socket, urllib, http, requests)",
    "processes": "child processes (subprocess, os.system/fork/exec/spawn, multiprocessing)",
    "threads": "threads (threading, _thread, concurrent.futures, asyncio)",
    "ctypes": "native code (ctypes, cffi, mmap, cpp_extension, torch.ops.load_library)",
    "timers": "clock tampering or monkeypatching imported modules",
    "introspection": "introspection (gc, inspect, frames, sys.modules, builtins)",
    "harness": "reaching the harness, infra_agent, files outside the workspace or secrets",
    "dynamic": "dynamic code (eval, exec, compile, __import__, importlib, pickle)",
    "state": "state kept across calls (module-level caches, functools.cache, global, f.attr)",
}
ALWAYS_ENFORCED = frozenset({"harness", "timers"})
AUDITED_GROUPS = frozenset({"network", "processes", "introspection", "threads"})
"""Groups the RPC worker's audit hook also enforces at run time (see rpc_worker.Guard)."""
RUNTIME_GROUPS = {
    "background": "threads outliving a call and working between calls (the process watch)",
}
"""Groups a task may allow that no static rule reads: run-time rules of the worker."""
ALIASES = {
    "threading": "threads",
    "network": "network",
    "subprocess": "processes",
    "native": "ctypes",
}

_MODULE_GROUPS = {
    "socket": "network", "urllib": "network", "http": "network", "requests": "network",
    "httpx": "network", "aiohttp": "network", "ssl": "network", "ftplib": "network",
    "smtplib": "network", "telnetlib": "network", "xmlrpc": "network", "websocket": "network",
    "subprocess": "processes", "multiprocessing": "processes", "pty": "processes",
    "signal": "processes", "torch.multiprocessing": "processes",
    "threading": "threads", "_thread": "threads", "concurrent": "threads", "asyncio": "threads",
    "ctypes": "ctypes", "cffi": "ctypes", "mmap": "ctypes", "torch.utils.cpp_extension": "ctypes",
    "gc": "introspection", "inspect": "introspection", "traceback": "introspection",
    "builtins": "introspection", "sys": None, "dis": "introspection",
    "infra_agent": "harness", "harness": "harness", "resource": "harness", "shutil": None,
    "importlib": "dynamic", "runpy": "dynamic", "pickle": "dynamic", "marshal": "dynamic",
    "dill": "dynamic", "cloudpickle": "dynamic", "code": "dynamic", "codeop": "dynamic",
}  # fmt: skip
_OS_CALLS = {
    "system": "processes", "popen": "processes", "fork": "processes", "forkpty": "processes",
    "posix_spawn": "processes", "posix_spawnp": "processes", "kill": "processes",
    "killpg": "processes", "setsid": "processes", "getenv": "harness", "environ": "harness",
    "getenvb": "harness", "environb": "harness", "chdir": "harness", "chroot": "harness",
    "putenv": "harness", "unsetenv": "harness",
}  # fmt: skip
_OS_PREFIXES = {"exec": "processes", "spawn": "processes"}
_SYS_ATTRS = {
    "_getframe": "introspection", "modules": "introspection", "meta_path": "introspection",
    "path_hooks": "introspection", "settrace": "introspection", "setprofile": "introspection",
    "path": "harness", "_current_frames": "introspection", "addaudithook": "introspection",
    "stdout": "harness", "__stdout__": "harness",
}  # fmt: skip
_DUNDER_ATTRS = {
    "__globals__", "__code__", "__closure__", "__subclasses__", "__builtins__", "__bases__",
    "__mro__", "f_back", "f_locals", "f_globals", "gi_frame", "tb_frame", "__loader__", "__spec__",
}  # fmt: skip
_ATTR_GROUPS = {
    "load_library": ("ctypes", "loads a native library"),
    "cpp_extension": ("ctypes", "compiles native code (cpp_extension)"),
    "multiprocessing": ("processes", "uses torch.multiprocessing"),
    "set_num_threads": ("threads", "changes the number of compute threads"),
    "set_num_interop_threads": ("threads", "changes the number of compute threads"),
    "expanduser": ("harness", "reads the home folder"),
}
_DYNAMIC_CALLS = {
    "eval",
    "exec",
    "compile",
    "__import__",
    "breakpoint",
    "globals",
    "vars",
    "locals",
}
_ABSOLUTE = re.compile(r"^(/|~|[A-Za-z]:\\)")


@dataclass(frozen=True)
class Violation:
    """One forbidden construct: its group, where, and what it is in words."""

    group: str
    path: str
    line: int
    what: str

    def describe(self) -> str:
        return f"rule '{self.group}': {self.path}:{self.line} {self.what}"


def _group_of_module(name: str) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in _MODULE_GROUPS:
            return _MODULE_GROUPS[prefix]
    return None


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.found: list[Violation] = []
        self.modules: dict[str, str] = {}
        """Local name -> imported module name."""

    def _add(self, group: str, node: ast.AST, what: str) -> None:
        self.found.append(Violation(group, self.path, getattr(node, "lineno", 0), what))

    def _module(self, node: ast.AST, name: str, local: str) -> None:
        self.modules[local] = name
        group = _group_of_module(name)
        if group is not None:
            self._add(group, node, f"imports {name}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module(node, alias.name, alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level > 0 and node.level > 1:
            self._add("harness", node, "imports from outside its package ('..' relative import)")
        base = node.module or ""
        for alias in node.names:
            full = f"{base}.{alias.name}" if base else alias.name
            local = alias.asname or alias.name
            if base in ("os", "posix"):
                self._os_attr(node, alias.name)
            elif base == "sys" and alias.name in _SYS_ATTRS:
                self._add(_SYS_ATTRS[alias.name], node, f"imports sys.{alias.name}")
            self._module(node, full if _group_of_module(full) else base, local)

    def _os_attr(self, node: ast.AST, attr: str) -> None:
        group = _OS_CALLS.get(attr)
        if group is None:
            group = next((g for p, g in _OS_PREFIXES.items() if attr.startswith(p)), None)
        if group is not None:
            self._add(group, node, f"uses os.{attr}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in _DUNDER_ATTRS:
            self._add("introspection", node, f"uses .{node.attr}")
        if isinstance(node.value, ast.Name):
            module = self.modules.get(node.value.id, node.value.id)
            if module in ("os", "posix"):
                self._os_attr(node, node.attr)
            elif module == "sys" and node.attr in _SYS_ATTRS:
                self._add(_SYS_ATTRS[node.attr], node, f"uses sys.{node.attr}")
        if node.attr in _ATTR_GROUPS:
            group, what = _ATTR_GROUPS[node.attr]
            self._add(group, node, what)
        if (
            node.attr == "fork"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "jit"
        ):
            self._add("threads", node, "uses torch.jit.fork (asynchronous work)")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__loader__", "__spec__"):
            self._add("introspection", node, f"uses {node.id}")

    def _target_module(self, target: ast.expr) -> str | None:
        """If `target` is `module.attr[...]`, the module's name."""
        while isinstance(target, ast.Attribute | ast.Subscript):
            target = target.value
            if isinstance(target, ast.Name) and target.id in self.modules:
                return self.modules[target.id]
        return None

    def _check_store(self, node: ast.AST, targets: list[ast.expr]) -> None:
        for target in targets:
            if isinstance(target, ast.Attribute | ast.Subscript):
                module = self._target_module(target)
                if module is not None:
                    self._add("timers", node, f"assigns into module {module} (monkeypatching)")

    def visit_Assign(self, node: ast.Assign) -> None:
        self._check_store(node, node.targets)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node, [node.target])
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        self._check_store(node, node.targets)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if name in _DYNAMIC_CALLS:
            self._add("dynamic", node, f"calls {name}()")
        if name in ("setattr", "delattr") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Name) and first.id in self.modules:
                self._add("timers", node, f"{name}() on module {self.modules[first.id]}")
        if name in ("getattr", "setattr", "delattr", "hasattr") and len(node.args) >= 2:
            if not isinstance(node.args[1], ast.Constant):
                self._add("dynamic", node, f"{name}() with a computed attribute name")
        if isinstance(func, ast.Attribute) and func.attr == "home":
            self._add("harness", node, "reads the home folder")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str | bytes):
            text = (
                node.value.decode(errors="replace") if isinstance(node.value, bytes) else node.value
            )
            if _ABSOLUTE.match(text) and len(text) > 1 and "\n" not in text:
                self._add("harness", node, f"names an absolute path {text[:60]!r}")
            elif re.search(r"(^|[/\\])\.\.([/\\]|$)", text):
                self._add("harness", node, f"names a path outside the workspace {text[:60]!r}")


def scan_source(source: str, path: str) -> list[Violation]:
    """Rule hits in one Python file. A file that does not parse is itself a violation."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        return [Violation("syntax", path, exc.lineno or 0, f"does not parse ({exc.msg})")]
    visitor = _Visitor(path)
    visitor.visit(tree)
    state = [Violation("state", path, hit.line, hit.what) for hit in scan_state(tree)]
    return visitor.found + state


def normalize_allow(allow: list[str]) -> set[str]:
    groups = {ALIASES.get(a, a) for a in allow}
    return groups - ALWAYS_ENFORCED


def new_violations(
    before: dict[str, str | None], after: dict[str, str | None], allow: list[str]
) -> list[Violation]:
    """Violations in `after` (path -> source, None if deleted) not already in `before`, minus
    the groups the task allows. Only Python files are read; other files are not code here."""
    allowed = normalize_allow(allow)
    found: list[Violation] = []
    for path, source in sorted(after.items()):
        if source is None or not path.endswith(".py"):
            continue
        old = before.get(path)
        existing = Counter(
            (v.group, v.what) for v in (scan_source(old, path) if old is not None else [])
        )
        for violation in scan_source(source, path):
            key = (violation.group, violation.what)
            if existing[key] > 0:
                existing[key] -= 1
            elif violation.group not in allowed:
                found.append(violation)
    return found
