"""Trace a process by pid, or a command started for the purpose: `trace_pid`, `trace_command`."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.feedback.gil.analysis import GilReport, ThreadSample, analyze
from infra_agent.feedback.gil.inprocess import METHOD as INPROCESS_METHOD
from infra_agent.feedback.gil.pyspy import DEFAULT_INTERVAL_S, PySpyUnavailable, sample_pid

PYSPY_METHOD = "py-spy dump --json --native, repeated"


def trace_pid(
    pid: int,
    *,
    duration_s: float = 5.0,
    interval_s: float = DEFAULT_INTERVAL_S,
    native: bool = True,
    nonblocking: bool = False,
    blame_threshold: float = 0.2,
) -> GilReport:
    """Sample a running Python process with py-spy; raises PySpyUnavailable if it cannot."""
    if pid <= 0:
        raise UserError(f"bad pid {pid}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError as exc:
        raise UserError(f"no process with pid {pid}") from exc
    except PermissionError:
        pass  # exists, owned by someone else: py-spy will say whether it can attach
    snapshots, elapsed = sample_pid(
        pid, duration_s=duration_s, interval_s=interval_s, native=native, nonblocking=nonblocking
    )
    if not snapshots:
        raise UserError(f"no samples of pid {pid} (did it exit?)")
    with_native = native and not nonblocking
    method = PYSPY_METHOD if with_native else "py-spy dump --json, repeated (no native frames)"
    report = analyze(
        snapshots, method=method, duration_s=elapsed, pid=pid, blame_threshold=blame_threshold
    )
    if not with_native:
        report.warnings.append(
            "no native frames: a thread waiting for the GIL counts as running or idle"
        )
    return report


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _argv(command: str | Sequence[str]) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise UserError("empty command to trace")
    if argv[0].endswith(".py"):
        argv = [sys.executable, *argv]
    return argv


def trace_command(
    command: str | Sequence[str],
    *,
    duration_s: float = 5.0,
    startup_s: float = 0.5,
    interval_s: float = DEFAULT_INTERVAL_S,
    native: bool = True,
    blame_threshold: float = 0.2,
) -> GilReport:
    """Start `command` (a script.py runs with this interpreter), sample it after `startup_s`,
    then stop it (process group). Falls back to in-process sampling for `python script.py`
    when py-spy cannot attach."""
    argv = _argv(command)
    proc = subprocess.Popen(
        argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        time.sleep(startup_s)
        if proc.poll() is not None:
            err = (proc.stderr.read().decode(errors="replace") if proc.stderr else "").strip()
            raise UserError(
                f"command exited with {proc.returncode} before sampling: {err.splitlines()[-1:] or ''}"
            )
        try:
            report = trace_pid(
                proc.pid,
                duration_s=duration_s,
                interval_s=interval_s,
                blame_threshold=blame_threshold,
            )
        except PySpyUnavailable as exc:
            if len(argv) < 2 or not argv[1].endswith(".py"):
                raise
            report = _trace_in_process(argv[1:], duration_s, blame_threshold)
            report.warnings.append(f"py-spy unavailable ({exc}); fell back to in-process sampling")
        return report
    finally:
        _stop(proc)


def _trace_in_process(
    script_argv: list[str], duration_s: float, blame_threshold: float
) -> GilReport:
    with tempfile.TemporaryDirectory(prefix="infra-agent-gil-") as tmp:
        out = Path(tmp) / "samples.json"
        cmd = [
            sys.executable,
            "-m",
            "infra_agent.feedback.gil.inprocess",
            str(out),
            str(duration_s),
        ]
        proc = subprocess.Popen([*cmd, *script_argv], start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + duration_s + 30
            while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if not out.exists():
                raise UserError("in-process sampler wrote no samples (script exited early?)")
            data = json.loads(out.read_text())
        finally:
            _stop(proc)
    snapshots = [[ThreadSample.model_validate(s) for s in snap] for snap in data["snapshots"]]
    return analyze(snapshots, method=INPROCESS_METHOD, duration_s=data["duration_s"],
                   blame_threshold=blame_threshold)  # fmt: skip
