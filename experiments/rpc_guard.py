"""The RPC worker's audit guard: what candidate code may not do inside the sandbox, enforced at
run time. Standalone (stdlib only): the harness writes it beside the worker, which loads it by
path before any candidate code runs (see rpc_worker); the candidate cannot import it.

`GUARD` is an audit hook (it cannot be removed once added): while active, a denied operation
(a rule group's events, an audit hook of the candidate's own, opening the harness or the package,
writing outside the workspace) raises PermissionError and is recorded, so the call is reported
as a rule violation even if the candidate swallows the exception. `hide_package` refuses the
package, the harness and the worker's files to imports. The worker's own audited work runs
`unguarded`, in its thread only.
"""

from __future__ import annotations

import builtins
import os
import sys
import threading
from typing import Any

# Functions here look builtins up in this private copy: a candidate rebinding builtins.len or
# builtins.open changes nothing here (functions take __builtins__ from their globals when defined).
globals()["__builtins__"] = dict(vars(builtins))
BLOCKED = ("infra_agent", "harness", "_infra_rpc_worker", "_infra_rpc_codec", "_infra_rpc_guard")
"""Top-level module names candidate code may not import."""

AUDIT_EVENTS = {
    "network": ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"),
    "processes": ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                  "os.fork", "os.forkpty", "os.kill", "os.killpg", "pty.spawn"),
    "introspection": ("gc.get_objects", "gc.get_referrers", "gc.get_referents",
                      "sys._current_frames", "sys.settrace", "sys.setprofile"),
}  # fmt: skip
ALWAYS_DENIED = {
    "sys.addaudithook": "an audit hook (it would run candidate code in every operation)"
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_os_open, _os_close, _readlink, _getcwd = os.open, os.close, os.readlink, os.getcwd
_get_ident, _O_PATH = threading.get_ident, os.O_PATH
_trusted: set[int] = set()
"""Threads doing the worker's own audited work at this moment (the O_PATH opens of `_realpath`,
preloads, installing the put profiler): the guard lets their events pass. Every other thread is
guarded from the first request on, between requests too (a thread the task lets live between
calls is no less the candidate's)."""


def _realpath(path: str | bytes) -> str:
    """`path` with symlinks resolved, by the kernel (an O_PATH descriptor and its /proc link),
    with no Python code of os.path (a candidate may patch it, or the builtins it uses). A path
    that does not exist yet resolves through its folder."""
    me = _get_ident()
    _trusted.add(me)  # our own O_PATH opens are not the candidate's
    try:
        return _resolved(path)
    finally:
        _trusted.discard(me)


def _resolved(path: str | bytes) -> str:
    if not isinstance(path, str):  # the audit event's argument: exactly str or bytes
        path = bytes.decode(path, "utf-8", "surrogateescape")
    if not path.startswith("/"):
        path = _getcwd() + "/" + path
    head, tail = path, ""
    while head:
        try:
            fd = _os_open(head, _O_PATH)
        except OSError:
            head, _, name = head.rpartition("/")
            tail = name + ("/" + tail if tail else "")
            continue
        try:
            real = _readlink(f"/proc/self/fd/{fd}")
        finally:
            _os_close(fd)
        return real.rstrip("/") + ("/" + tail if tail else "") if real != "/" else "/" + tail
    return "/" + tail


def unguarded(function: Any, *args: Any) -> Any:
    """Run the worker's own audited work in this thread only, unguarded (see `_trusted`)."""
    me = _get_ident()
    _trusted.add(me)
    try:
        return function(*args)
    finally:
        _trusted.discard(me)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


class Guard:
    """Audit hook (cannot be removed once added): while active, denied operations raise
    PermissionError and are recorded, so the call is reported as a rule violation even if the
    candidate swallows the exception. It backs up the static rules against obfuscation. Active
    from the first request on, in every thread but one doing the worker's own trusted work
    (`_trusted`): during every operation and between operations alike. A violation a thread
    commits between requests is reported by the next one."""

    def __init__(self) -> None:
        self.active = False
        self.events: dict[str, str] = {}
        self.forbidden: list[str] = []
        self.exempt: list[str] = []
        self.writable: list[str] = []
        self.violations: list[str] = []

    def configure(self, config: dict[str, list[str]]) -> None:
        for group in config.get("deny", []):
            for event in AUDIT_EVENTS.get(group, ()):
                self.events[event] = group
        self.forbidden = [_realpath(p) for p in config.get("forbidden", [])]
        self.exempt = [_realpath(p) for p in config.get("exempt", [])]
        self.writable = [_realpath(p) for p in config.get("writable", [])]

    def _deny(self, what: str) -> None:
        self.violations.append(what)
        raise PermissionError(f"infra-agent sandbox: {what} is not allowed")

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or _get_ident() in _trusted:
            return
        if event in ALWAYS_DENIED:
            self._deny(f"{event}: {ALWAYS_DENIED[event]}")
        group = self.events.get(event)
        if group is not None:
            self._deny(f"{event} (rule group '{group}')")
        if event == "open" and args and type(args[0]) in (str, bytes):
            path = _realpath(args[0])
            mode, flags = (
                (args[1] if len(args) > 1 else "r") or "r",
                args[2] if len(args) > 2 else 0,
            )
            writing = (type(mode) is str and any(c in mode for c in "wax+")) or bool(
                (flags if type(flags) is int else 0) & _WRITE_FLAGS
            )
            if _under(path, self.forbidden) and not _under(path, self.exempt):
                self._deny(f"opening {path} (the harness or the package)")
            if writing and not _under(path, self.writable):
                self._deny(f"writing {path} (outside the workspace)")


GUARD = Guard()


class _Blocker:
    """Meta-path finder that refuses the package, the harness and this worker."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] in BLOCKED:
            if GUARD.active:
                GUARD.violations.append(f"importing {name} (the package or the harness)")
            raise ImportError(f"{name} is not available to candidate code")
        return None


def hide_package() -> None:
    """Refuse the package, the harness and the worker's own files to every later import."""
    sys.meta_path[:] = [
        f for f in sys.meta_path if "editable" not in type(f).__module__ + repr(f).lower()
    ]
    sys.meta_path.insert(0, _Blocker())
    for name in list(sys.modules):
        if name.split(".")[0] in BLOCKED:
            del sys.modules[name]
