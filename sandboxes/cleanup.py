"""Guaranteed cleanup: every live sandbox is registered here until its `cleanup()` ran.

Paths that end a Python process and how each one is covered:
- normal exit, exceptions, Ctrl-C (KeyboardInterrupt): the context manager, then `atexit`;
- SIGTERM / SIGHUP: a handler cleans every live sandbox, then restores the previous handler and
  re-raises the signal so the process still dies the way it was asked to;
- SIGKILL of the parent: nothing can run; sandboxed processes die with it (PR_SET_PDEATHSIG and
  bubblewrap's --die-with-parent), and the temporary folders it left are swept by the next
  sandbox created (`workspace.sweep_stale`).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Protocol

log = logging.getLogger(__name__)


class Cleanable(Protocol):
    def cleanup(self) -> None: ...


_live: weakref.WeakValueDictionary[int, Cleanable] = weakref.WeakValueDictionary()
_lock = threading.Lock()
_installed = False
_CAUGHT = (signal.SIGTERM, signal.SIGHUP)


def register(sandbox: Cleanable) -> None:
    """Track `sandbox` until `unregister`; installs the exit hooks on first use."""
    _install()
    with _lock:
        _live[id(sandbox)] = sandbox


def unregister(sandbox: Cleanable) -> None:
    with _lock:
        _live.pop(id(sandbox), None)


def cleanup_all() -> int:
    """Clean every live sandbox (newest first). Returns how many were cleaned."""
    with _lock:
        pending = list(_live.values())
    for sandbox in reversed(pending):
        try:
            sandbox.cleanup()
        except Exception:  # a failing cleanup must not stop the others
            log.exception("sandbox cleanup failed")
    return len(pending)


def _install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    atexit.register(cleanup_all)
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; atexit still covers exit
    for signum in _CAUGHT:
        previous = signal.getsignal(signum)
        if previous is signal.SIG_IGN:
            continue
        signal.signal(signum, _handler(signum, previous))


def _handler(
    signum: int, previous: Callable[[int, FrameType | None], object] | int | None
) -> Callable[[int, FrameType | None], None]:
    def handle(received: int, frame: FrameType | None) -> None:
        cleanup_all()
        if callable(previous):
            previous(received, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    return handle
