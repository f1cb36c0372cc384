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
from typing import Literal

from infra_agent.errors import UserError
from infra_agent.feedback.gil.analysis import analyze
from infra_agent.feedback.gil.holders import merge_holders
from infra_agent.feedback.gil.inprocess import METHOD as INPROCESS_METHOD
from infra_agent.feedback.gil.pyspy import DEFAULT_INTERVAL_S as DUMP_INTERVAL_S
from infra_agent.feedback.gil.pyspy import PySpyUnavailable, sample_pid
from infra_agent.feedback.gil.record import DEFAULT_INTERVAL_S as RECORD_INTERVAL_S
from infra_agent.feedback.gil.record import Recording, record_pid
from infra_agent.feedback.gil.report import GilReport, ThreadSample
from infra_agent.feedback.gil.threads import own_pid_namespace

Sampler = Literal["record", "dump"]
"""`record`: two long-lived `py-spy record`s per trace (default; one pause of ~0.1-0.3 s on the
first sample while native symbols load, then ~1 ms per sample; exact GIL holders without
pausing, but blame over the whole trace). `dump`: a fresh `py-spy dump --json` per snapshot
(GIL ownership and waits at the same instants, but with native frames each dump pauses the
target ~0.1-0.3 s while symbols load: +30-60% slowdown at 1/s)."""


NO_NATIVE_IN_PIDNS = (
    "no native frames: the process runs in a pid namespace of its own (a confined server), "
    "where py-spy record --native always fails (it unwinds threads by the namespace's ids: "
    "UNW_EBADREG); non-pausing dumps instead, each thread's activity from the kernel"
)


def trace_pid(
    pid: int,
    *,
    duration_s: float = 5.0,
    interval_s: float | None = None,
    native: bool = True,
    nonblocking: bool = False,
    blame_threshold: float = 0.2,
    sampler: Sampler | None = None,
) -> GilReport:
    """Sample a running Python process with py-spy; raises PySpyUnavailable if it cannot.

    `sampler` defaults to `record`; to `dump` without native frames or when `nonblocking`
    (a dump reads GIL ownership and thread activity without pausing; a recorder without native
    frames could not tell waiting from sleeping), and when the default `record` fails (native
    unwinding fails across some sandboxes), to non-pausing dumps without native frames.
    `interval_s` defaults to 0.1 s for `record`, 1 s for `dump`.
    """
    if pid <= 0:
        raise UserError(f"bad pid {pid}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError as exc:
        raise UserError(f"no process with pid {pid}") from exc
    except PermissionError:
        pass  # exists, owned by someone else: py-spy will say whether it can attach
    confined = sampler is None and native and not nonblocking and own_pid_namespace(pid)
    if confined:  # native unwinding is known to fail there: no ~10 s of py-spy's retries
        report = trace_pid(
            pid, duration_s=duration_s, interval_s=interval_s, nonblocking=True,
            blame_threshold=blame_threshold,
        )  # fmt: skip
        report.warnings.append(NO_NATIVE_IN_PIDNS)
        return report
    with_native = native and not nonblocking
    chosen: Sampler = sampler or ("record" if with_native else "dump")
    if chosen == "record":
        if not with_native:
            raise UserError("sampler 'record' needs native frames; use sampler 'dump' without")
        try:
            return _trace_record(pid, duration_s, interval_s or RECORD_INTERVAL_S, blame_threshold)
        except PySpyUnavailable as exc:
            if sampler == "record":
                raise
            # Native unwinding fails across some sandboxes: a dump without native frames still
            # reads GIL ownership and thread activity, and never pauses the target.
            report = trace_pid(
                pid,
                duration_s=duration_s,
                interval_s=interval_s,
                nonblocking=True,
                blame_threshold=blame_threshold,
            )
            report.warnings.append(f"record sampler failed ({exc}); used non-pausing dumps")
            return report
    if chosen != "dump":
        raise UserError(f"unknown sampler {chosen!r} (record or dump)")
    snapshots, elapsed = sample_pid(
        pid,
        duration_s=duration_s,
        interval_s=interval_s or DUMP_INTERVAL_S,
        native=native,
        nonblocking=nonblocking,
    )
    if not snapshots:
        raise UserError(f"no samples of pid {pid} (did it exit?)")
    method = f"py-spy dump --json{' --native' if with_native else ''}, one process per snapshot"
    report = analyze(
        snapshots, method=method, duration_s=elapsed, pid=pid, blame_threshold=blame_threshold
    )
    if not with_native:
        report.warnings.append(
            "no native frames: a thread waiting for the GIL counts as running or idle"
        )
    return report


def _trace_record(
    pid: int, duration_s: float, interval_s: float, blame_threshold: float
) -> GilReport:
    rec = record_pid(pid, duration_s=duration_s, interval_s=interval_s)
    return report_of_recording(rec, pid, max(1, round(1.0 / interval_s)), blame_threshold)


def report_of_recording(rec: Recording, pid: int, rate: int, blame_threshold: float) -> GilReport:
    """The report of a `record` sampler's recording (stacks analyzed, exact holders merged)."""
    if not rec.snapshots:
        raise UserError(f"no samples of pid {pid} (did it exit?)")
    exact = rec.held is not None
    method = f"py-spy record --native{' + --gil' if exact else ''}, one process each, {rate}/s"
    report = analyze(
        rec.snapshots, method=method, duration_s=rec.duration_s, pid=pid,
        blame_threshold=blame_threshold,
    )  # fmt: skip
    report.gil_inferred = True
    if rec.held is not None:
        merge_holders(report, rec.held, rec.ticks)
        report.warnings.append(
            "blame: GIL holders over the whole trace (py-spy record --gil), not only while the "
            "waiter waited; sampler='dump' gives same-instant holders at a higher cost"
        )
    else:
        report.warnings.append(
            "GIL holder inferred: a thread executing Python holds it; native code keeping the "
            "GIL counts as runs-native (sampler='dump' reads ownership)"
        )
    report.warnings.extend(rec.warnings)
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
    interval_s: float | None = None,
    native: bool = True,
    blame_threshold: float = 0.2,
    sampler: Sampler | None = None,
) -> GilReport:
    """Start `command` (a script.py runs with this interpreter), sample it after `startup_s`
    with `trace_pid`, then stop it (process group). Falls back to in-process sampling for
    `python script.py` when py-spy cannot attach."""
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
                native=native,
                blame_threshold=blame_threshold,
                sampler=sampler,
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
