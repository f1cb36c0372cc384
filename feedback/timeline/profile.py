"""Record a timeline with `torch.profiler`: a Python callable here, or a Python script in a child.

`profile_callable(fn, repeat=1) -> list[TraceEvent]` runs `fn` `repeat` times under the profiler
(CPU activity always, CUDA activity when `torch.cuda.is_available()`, all threads where torch
supports it, host tracks named by thread); `record_function("name")` annotations appear as `user_annotation` events. `profile_script(argv, trace_path)` runs
`python <script> <args>` under the profiler in a child process and writes a Chrome trace.
Other programs cannot be profiled this way; record them with `nsys` and load the export.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from infra_agent.errors import UserError
from infra_agent.feedback.timeline.events import TraceEvent, load_chrome_trace


def all_threads_option() -> dict[str, Any]:
    """Ask torch.profiler to record every thread (torch >= 2.8 `profile_all_threads`);
    without it, only the thread that started the profiler is recorded."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


@contextmanager
def named_threads() -> Iterator[dict[int, str]]:
    """OS thread id -> name of this process's threads: those alive on entry or exit, and those
    started inside (each noted on its first call; a worker started per call is gone by exit)."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id}

    def note(*args: Any) -> None:
        names[threading.get_native_id()] = threading.current_thread().name
        sys.setprofile(None)

    threading.setprofile(note)
    try:
        yield names
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]
        names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id})


def profile_callable(
    fn: Callable[[], Any], *, repeat: int = 1, trace_path: Path | None = None
) -> list[TraceEvent]:
    """Profile `repeat` calls of `fn`; keep the Chrome trace at `trace_path` if given."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    with named_threads() as names, profile(activities=activities, **all_threads_option()) as prof:
        for _ in range(repeat):
            fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="infra-agent-trace-") as tmp:
        path = trace_path or Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return load_chrome_trace(path, names)


def profile_script(
    argv: Sequence[str], trace_path: Path, *, timeout_s: float = 600.0
) -> list[TraceEvent]:
    """Run `python script.py args...` (argv[0] a .py file) under torch.profiler in a child."""
    if not argv or not str(argv[0]).endswith(".py"):
        raise UserError(
            "torch.profiler can only record Python scripts (script.py args...); record other "
            "programs with nsys and pass the exported trace"
        )
    if not Path(argv[0]).is_file():
        raise UserError(f"script not found: {argv[0]}")
    cmd = [
        sys.executable,
        "-m",
        "infra_agent.feedback.timeline.run_profiled",
        str(trace_path),
        *argv,
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout_s, env=os.environ
        )
    except subprocess.TimeoutExpired as exc:
        raise UserError(f"profiled script timed out after {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise UserError(f"profiled script exited with {proc.returncode}: {tail[:200]}")
    names = json.loads(thread_names_path(trace_path).read_text())
    return load_chrome_trace(trace_path, {int(tid): name for tid, name in names.items()})


def thread_names_path(trace_path: Path) -> Path:
    """Where `run_profiled` writes the script's thread names (OS thread id -> name)."""
    return trace_path.with_name(trace_path.name + ".threads.json")
