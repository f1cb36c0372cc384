"""The static rules' groups and what belongs to each: the modules, os and sys attributes,
attribute names and calls that put a construct in a group (read by `experiments/rules.py`), and
which groups a task may allow. A new rule is a line in one of these tables.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUPS = {
    "network": "network access (socket, urllib, http, requests)",
    "processes": "processes (subprocess, os.system/fork/exec/spawn, multiprocessing, signal, "
    "psutil, Python run from a string: python -c)",
    "threads": "threads (threading, _thread, concurrent.futures, asyncio)",
    "ctypes": "native code (ctypes, cffi, mmap, cpp_extension, torch.ops.load_library, torch.library)",
    "timers": "clock tampering or monkeypatching imported modules",
    "introspection": "introspection (gc, inspect, frames, sys.modules, builtins)",
    "harness": "reaching the harness, infra_agent, files outside the workspace or secrets",
    "dynamic": "dynamic code (eval, exec, compile, __import__, importlib, pickle)",
    "state": "state kept across calls (module-level caches, functools.cache, global, f.attr)",
}
ALWAYS_ENFORCED = frozenset({"harness", "timers"})
AUDITED_GROUPS = frozenset({"network", "processes", "introspection"})
"""Groups the RPC worker's audit hook also enforces at run time (see rpc_guard.Guard)."""
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

MODULE_GROUPS = {
    "socket": "network", "urllib": "network", "http": "network", "requests": "network",
    "httpx": "network", "aiohttp": "network", "ssl": "network", "ftplib": "network",
    "smtplib": "network", "telnetlib": "network", "xmlrpc": "network", "websocket": "network",
    "torch.library": "ctypes",  # registers or replaces operator kernels (aten ops included)
    "subprocess": "processes", "multiprocessing": "processes", "pty": "processes",
    "signal": "processes", "torch.multiprocessing": "processes", "psutil": "processes",
    "threading": "threads", "_thread": "threads", "concurrent": "threads", "asyncio": "threads",
    "ctypes": "ctypes", "cffi": "ctypes", "mmap": "ctypes", "torch.utils.cpp_extension": "ctypes",
    "gc": "introspection", "inspect": "introspection", "traceback": "introspection",
    "builtins": "introspection", "sys": None, "dis": "introspection",
    "infra_agent": "harness", "harness": "harness", "resource": "harness", "shutil": None,
    "importlib": "dynamic", "runpy": "dynamic", "pickle": "dynamic", "marshal": "dynamic",
    "dill": "dynamic", "cloudpickle": "dynamic", "code": "dynamic", "codeop": "dynamic",
}  # fmt: skip
OS_CALLS = {
    "system": "processes", "popen": "processes", "fork": "processes", "forkpty": "processes",
    "posix_spawn": "processes", "posix_spawnp": "processes", "kill": "processes",
    "killpg": "processes", "setsid": "processes", "getenv": "harness", "environ": "harness",
    "getenvb": "harness", "environb": "harness", "chdir": "harness", "chroot": "harness",
    "putenv": "harness", "unsetenv": "harness",
}  # fmt: skip
OS_PREFIXES = {"exec": "processes", "spawn": "processes"}
SYS_ATTRS = {
    "_getframe": "introspection", "modules": "introspection", "meta_path": "introspection",
    "path_hooks": "introspection", "settrace": "introspection", "setprofile": "introspection",
    "path": "harness", "_current_frames": "introspection", "addaudithook": "introspection",
    "stdout": "harness", "__stdout__": "harness",
}  # fmt: skip
DUNDER_ATTRS = {
    "__globals__", "__code__", "__closure__", "__subclasses__", "__builtins__", "__bases__",
    "__mro__", "f_back", "f_locals", "f_globals", "gi_frame", "tb_frame", "__loader__", "__spec__",
}  # fmt: skip
ATTR_GROUPS = {
    "load_library": ("ctypes", "loads a native library"),
    "cpp_extension": ("ctypes", "compiles native code (cpp_extension)"),
    "multiprocessing": ("processes", "uses torch.multiprocessing"),
    "set_num_threads": ("threads", "changes the number of compute threads"),
    "set_num_interop_threads": ("threads", "changes the number of compute threads"),
    "expanduser": ("harness", "reads the home folder"),
}
DYNAMIC_CALLS = {
    "eval",
    "exec",
    "compile",
    "__import__",
    "breakpoint",
    "globals",
    "vars",
    "locals",
}
IMPORTERS = {"__import__", "importlib.import_module", "importlib.__import__"}
"""Callables that import the module their first argument names."""
ATTRIBUTE_CALLS = {"getattr", "setattr", "delattr", "hasattr"}


@dataclass(frozen=True)
class Violation:
    """One forbidden construct: its group, where, and what it is in words."""

    group: str
    path: str
    line: int
    what: str

    def describe(self) -> str:
        return f"rule '{self.group}': {self.path}:{self.line} {self.what}"


def group_of_module(name: str) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        prefix = ".".join(parts[:i])
        if prefix in MODULE_GROUPS:
            return MODULE_GROUPS[prefix]
    return None


def normalize_allow(allow: list[str]) -> set[str]:
    """The groups a manifest's `allow` list names (aliases resolved), never the enforced ones."""
    groups = {ALIASES.get(a, a) for a in allow}
    return groups - ALWAYS_ENFORCED
