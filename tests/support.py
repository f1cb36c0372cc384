"""Helpers for tests (importable as `support`; tests/ is on pytest's pythonpath)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals tests send to a child to stop it cleanly (SIGKILL cannot be ignored)."""


NO_SGLANG_ENV = "SGLang environment not created (python -m infra_agent.serving.env --ensure)"


@contextmanager
def loopback_server(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> Iterator[str]:
    """A stand-in HTTP server on 127.0.0.1 answering each connection with `handle`, in an event
    loop on its own thread, for the `with` body: its URL."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def needs_sglang_env() -> pytest.MarkDecorator:
    """Skips a test (or file) where SGLang's own environment is not set up."""
    from infra_agent.serving.env import find_sglang_env

    return pytest.mark.skipif(find_sglang_env() is None, reason=NO_SGLANG_ENV)


def sglang_server_marks(timeout_s: int = 2400) -> list[pytest.MarkDecorator]:
    """`pytestmark` of a file whose tests start real SGLang servers: slow, `sglang` (such files
    run first, tests/conftest.py), skipped without SGLang's environment, and a timeout of
    `timeout_s` (server starts take 20-60 s on an idle 2-core machine, minutes on a shared one)."""
    return [
        pytest.mark.timeout(timeout_s),
        pytest.mark.slow,
        pytest.mark.sglang,
        needs_sglang_env(),
    ]


def stoppable() -> None:
    """`preexec_fn` for a child the test will stop with SIGINT or SIGTERM: both get their
    default action and are not blocked, as in a command typed at a terminal, whatever this test
    run inherited (a script's background job, as `nohup make test &` in one, ignores SIGINT;
    a Python child turns the default SIGINT into KeyboardInterrupt). SIGHUP is left as it is:
    under nohup the test's children must survive the terminal closing, as the run does."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `infra-agent ARGS` in a subprocess (as a user would) and capture its output."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "infra_agent.cli", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


GATED_PREPARE = """

# Test equipment (tests/support.py: ExperimentGate): from the {nth}th experiment of this task
# on, the prepare stage waits at a gate the test holds shut (a FIFO).
import os as _os
import stat as _stat
from pathlib import Path as _Path

_GATE = _Path({gate!r})
_Ungated = {cls}


class {cls}(_Ungated):
    def prepare(self, arm):
        if not self.__dict__.get("_gate_counted"):  # once per experiment: one harness each
            self.__dict__["_gate_counted"] = True
            with open(_GATE / "started", "a") as started:
                started.write(f"{{_os.getpid()}}\\n")
            nth = len((_GATE / "started").read_text().splitlines())
            if nth >= {nth} and _stat.S_ISFIFO((_GATE / "release").stat().st_mode):
                (_GATE / "held.tmp").write_text(str(_os.getpid()))
                _os.replace(_GATE / "held.tmp", _GATE / "held")
                with open(_GATE / "release"):  # returns once the test opens the gate
                    pass
        super().prepare(arm)
"""


class ExperimentGate:
    """Holds a task's experiments in progress until the test says so, so that a test can kill or
    interrupt a run "during an experiment" without guessing how long anything takes.

    Appends to the harness of `task` (a copy the test owns) a subclass whose `prepare` stage, from
    the `from_nth` experiment on (counted in `folder`, across processes), announces itself and
    blocks on a FIFO until `release()`."""

    def __init__(self, task: Path, folder: Path, *, from_nth: int = 1, cls: str = "TaskHarness"):
        self.folder = folder
        folder.mkdir()
        os.mkfifo(folder / "release")
        harness = task / "harness.py"
        gated = GATED_PREPARE.format(gate=str(folder), nth=from_nth, cls=cls)
        harness.write_text(harness.read_text() + gated)

    def wait_held(
        self,
        proc: subprocess.Popen[bytes] | None = None,
        log: Path | None = None,
        limit_s: float = 600,
    ) -> int:
        """Wait until an experiment is held at the gate; returns the pid of the process running
        it. AssertionError (with the tail of `log`) if `proc` exits first; `limit_s` only bounds
        a run that never gets there."""
        held = self.folder / "held"
        deadline = time.monotonic() + limit_s
        while not held.exists():
            ended = proc is not None and proc.poll() is not None
            if ended or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
                why = "the run exited" if ended else f"{limit_s:g} s passed"
                raise AssertionError(f"{why} before an experiment reached the gate: {tail}")
            time.sleep(0.05)
        return int(held.read_text())

    def release(self) -> None:
        """Open the gate for good: experiments waiting at it go on, later ones pass."""
        release = self.folder / "release"
        waiting = os.open(release, os.O_RDWR)  # a writer: readers blocked in open() return
        try:
            (self.folder / "open.tmp").write_text("open\n")
            os.replace(self.folder / "open.tmp", release)
        finally:
            os.close(waiting)

    @property
    def started(self) -> int:
        """Experiments of the task that reached their prepare stage so far."""
        path = self.folder / "started"
        return len(path.read_text().splitlines()) if path.exists() else 0


def quick_decode_task(parent: Path) -> Path:
    """A copy of decode-split-norm under `parent` with a smaller problem and measurement budget
    (same code and harness), named decode-split-norm-quick."""
    import re
    import shutil

    from infra_agent.tasks.registry import find_task

    folder = parent / "decode-split-norm-quick"
    shutil.copytree(find_task("decode-split-norm").root, folder)
    toml = folder / "task.toml"
    text = toml.read_text().replace(
        'name = "decode-split-norm"', 'name = "decode-split-norm-quick"'
    )
    text = re.sub(
        r"\[budget\][^\[]*",
        "[budget]\ncall_timeout_s = 30.0\nmin_samples = 5\nmax_samples = 12\n"
        "measure_budget_s = 3.0\ncorrectness_checks = 1\n\n",
        text,
    )
    text = re.sub(r"seq_len = \d+", "seq_len = 1024", text)
    toml.write_text(re.sub(r"steps = \d+", "steps = 2", text))
    return folder


def assert_agent_reads_no_site(task: Any, sites: set[tuple[str, str]]) -> None:
    """Nothing an agent reads of `task` (its name, title, story, the README above "Measured
    here", its harness) names a module or function its fault lives in."""
    readme = (task.root / "README.md").read_text()
    visible = readme.split("## Measured here")[0] + task.manifest.story
    visible += task.manifest.title + task.name
    harness = task.harness_path.read_text()
    for rel, function in sites:
        module = rel.rsplit("/", 1)[-1]
        assert module not in visible and module.removesuffix(".py") not in harness, rel
        assert function not in visible and function not in harness, function
