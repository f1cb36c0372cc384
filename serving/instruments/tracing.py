"""Profiles and GIL traces of a live server's processes while a workload runs.

    traces, result = trace_during(server, sessions, load, ["scheduler", "tokenizer"], gil_s=4)
    traces[0].profile.functions(package_dirs_of(server))   # the scheduler's hottest functions
    traces[0].gil.render()                                  # its threads' GIL states and blame

One workload (`LoadRun`) and, attached to each chosen process at once (py-spy, from outside:
the server shares this machine's process table), a function profile for the whole workload
(`feedback.pyprofile.profile_pid`, non-blocking) and a GIL trace over its first `gil_s` seconds
(`feedback.gil.trace_pid`). A process that is missing, died, or that py-spy cannot attach to
gets an error line in its trace instead; the other processes' results stand. The serving
diagnosis (`serving.instruments.diagnosis`) and the `server_profile` tool both run through here.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, computed_field

from infra_agent.errors import UserError
from infra_agent.feedback.gil import GilReport, ThreadGil, trace_pid
from infra_agent.feedback.pyprofile import FunctionProfile, FunctionTime, profile_pid
from infra_agent.judgement.intervals import share_error
from infra_agent.sandboxes.proctree import alive, cpu_seconds
from infra_agent.serving.instruments.live import LoadRun, describe, server_processes
from infra_agent.serving.load.datasets import Session
from infra_agent.serving.load.generator import LoadSpec, WorkloadResult
from infra_agent.serving.overlay import installed_package
from infra_agent.serving.server import Server

ROLES = ("scheduler", "tokenizer", "detokenizer")
"""The SGLang processes instruments attach to (`server_processes`' roles)."""
SETTLE_S = 0.5
"""GIL traces attach this long after the workload starts (past the first arrivals); profiles
attach before it starts and cover all of it."""
ATTACH_S = 30.0
"""The longest the workload waits for the profiles to attach."""
PROFILE_LIMIT_S = 600.0
"""The longest a profile records (it stops earlier, when the workload ends)."""


class ProcessTrace(BaseModel):
    """What the instruments saw of one server process during the workload."""

    role: str
    """'scheduler', 'tokenizer' or 'detokenizer'."""
    pid: int | None = None
    """None when the server has no such process."""
    profile: FunctionProfile | None = None
    gil: GilReport | None = None
    cpu_s: float | None = None
    """User + system CPU seconds the process used over the workload (None: no process)."""
    errors: list[str] = Field(default_factory=list)
    """One line per instrument that could not run (missing process, died, py-spy refused)."""


def package_dirs_of(server: Server) -> list[Path]:
    """Where `server` imports SGLang from: an overlay on its PYTHONPATH (a patched arm) first,
    then the installed package; profiles name files relative to these ('sglang/srt/...')."""
    path = server.env.get("PYTHONPATH", "")
    overlays = [Path(p) / "sglang" for p in path.split(os.pathsep) if p]
    return [d for d in overlays if d.is_dir()] + [installed_package(server.spec.sglang_version)]


def trace_during(
    server: Server,
    sessions: list[Session],
    load: LoadSpec,
    roles: list[str],
    *,
    profile: bool = True,
    gil_s: float | None = None,
) -> tuple[list[ProcessTrace], WorkloadResult | None]:
    """Run the workload and, on each of `roles`' processes, a function profile for the whole
    workload (`profile`) and a GIL trace over its first `gil_s` seconds (None: none). Returns one
    `ProcessTrace` per role (in order) and the workload's result; the workload's own failure is
    raised."""
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise UserError(f"unknown server process {unknown[0]!r}; choose from {', '.join(ROLES)}")
    pids = server_processes(server)
    traces = [ProcessTrace(role=r, pid=pids.get(r)) for r in roles]
    for t in traces:
        if t.pid is None:
            found = ", ".join(f"{r} {p}" for r, p in sorted(pids.items())) or "none"
            t.errors.append(f"the server has no {t.role} process (found: {found})")
    jobs: list[tuple[ProcessTrace, str, Future[Any]]] = []
    run = LoadRun(server, sessions, load)
    live = [t for t in traces if t.pid is not None]
    with ThreadPoolExecutor(max_workers=max(1, 2 * len(live))) as pool:
        # Profiles attach before the workload starts: a workload under a second would otherwise
        # end before py-spy samples, and the Ctrl-C that stops it would leave no file.
        stop = threading.Event()  # set when the workload is over, or never ran (Ctrl-C)
        attached: list[threading.Event] = []
        for t in live if profile else []:
            attached.append(threading.Event())
            jobs.append((t, "profile", pool.submit(_profile, t.pid, stop, attached[-1])))
        try:
            for ready in attached:
                ready.wait(timeout=ATTACH_S)
            before = {t.role: cpu_seconds({t.pid}) for t in live if t.pid is not None}
            with run:  # its end joins the workload (and raises the workload's failure)
                time.sleep(SETTLE_S)
                for t in live if gil_s else []:
                    assert t.pid is not None and gil_s is not None
                    jobs.append((t, "gil", pool.submit(trace_pid, t.pid, duration_s=gil_s)))
            for t in live:  # what the workload cost each process (the server's: LoadRun)
                t.cpu_s = cpu_seconds({t.pid}) - before[t.role] if t.pid is not None else None
        finally:
            stop.set()
        for t, kind, job in jobs:
            try:
                setattr(t, kind, job.result())
            except UserError as exc:  # py-spy missing or refused, the process gone
                t.errors.append(f"{kind}: {_why(t, exc)}")
    for t in traces:
        if t.pid is not None and not t.errors and not alive(t.pid):
            t.errors.append(f"the {t.role} process (pid {t.pid}) died during the workload")
    return traces, run.result


def _profile(pid: int | None, stop: threading.Event, ready: threading.Event) -> FunctionProfile:
    """`pid`'s profile until `stop` is set; `ready` is set once py-spy samples (or failed)."""
    assert pid is not None
    try:
        return profile_pid(pid, duration_s=PROFILE_LIMIT_S, until=stop.is_set, on_attach=ready.set)
    finally:
        ready.set()


def _why(trace: ProcessTrace, exc: Exception) -> str:
    line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if trace.pid is not None and not alive(trace.pid):
        return f"the {trace.role} process (pid {trace.pid}) died during the workload ({line})"
    return line


TOP = 5
"""Functions shown per process, by self and by total time."""
THREADS = 4
"""Threads shown per process (the busiest)."""
IDLE = 0.99
"""Threads idle at least this share of the GIL trace are counted, not shown."""
WIDTH = 140
"""Characters per rendered line, at most."""
FEW_SAMPLES = 20
"""Fewer active samples than this: a share is off by 10 points or more (binomial sd at 50%)."""
RENDER_CHARS = 2500
"""A server profile's text stays shorter (with the look's own lines after it, under 3,000): rows
of least self time give way first."""


class ProcessProfile(BaseModel):
    """One process's side of a `ServerProfile`: its hottest functions and its threads' GIL."""

    role: str
    pid: int | None = None
    samples: int = 0
    """Active-thread samples of the function profile."""
    duration_s: float = 0.0
    cpu_s: float | None = None
    """CPU seconds the process used over the workload (`ProcessTrace.cpu_s`)."""
    top_self: list[FunctionTime] = Field(default_factory=list)
    """Hottest by self time (innermost SGLang frame), with their shares of active samples."""
    top_total: list[FunctionTime] = Field(default_factory=list)
    """Hottest with their callees (anywhere on the stack): the innermost function every sample
    passes through (e.g. the scheduler's event loop), then the hottest below it."""
    gil: GilReport | None = None
    errors: list[str] = Field(default_factory=list)
    asleep: dict[str, int] = Field(default_factory=dict)
    """Threads left out of the samples, asleep by the kernel's account (`FunctionProfile.asleep`):
    thread label -> samples py-spy had counted active."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def share_error(self) -> float:
        """The 95% sampling error of a share (at its widest, a 50% share), were the samples
        independent: 1.96 * sqrt(0.25 / samples); 1.0 without samples."""
        return share_error(self.samples)

    @classmethod
    def of(cls, trace: ProcessTrace, dirs: list[Path]) -> ProcessProfile:
        profile = trace.profile
        rows = profile.functions(dirs, limit=10**6) if profile else []
        depth = profile.depths(dirs) if profile else {}
        # By total time, callees before their callers at equal time; of the entry chain every
        # sample passes through (the process's main loop and its callers), only the innermost.
        ranked = [r for r in rows if not _wrapper(r)]
        by_total = sorted(ranked, key=lambda r: (r.total_samples, depth[r.where]), reverse=True)
        entry = by_total[:1]
        below = [r for r in by_total if entry and r.total_samples < entry[0].total_samples]
        return cls(
            role=trace.role, pid=trace.pid,
            samples=profile.samples if profile else 0,
            duration_s=profile.duration_s if profile else 0.0, cpu_s=trace.cpu_s,
            top_self=[r for r in rows if r.self_samples][:TOP], top_total=(entry + below)[:TOP],
            gil=trace.gil, errors=list(trace.errors), asleep=profile.asleep if profile else {},
        )  # fmt: skip

    def render(self, top: int = TOP) -> list[str]:
        """Its lines, with the `top` hottest functions by self time."""
        head = f"{self.role} (pid {self.pid})" if self.pid else self.role
        cpu = f"{self.cpu_s:.1f} CPU-s" if self.cpu_s is not None else "CPU not counted"
        if self.cpu_s is not None and self.duration_s > 0:
            cpu += f" ({self.cpu_s / self.duration_s:.2f} cores)"
        lines = [f"{head}: {cpu}; {self.samples} active samples in {self.duration_s:.1f} s"]
        if 0 < self.samples < FEW_SAMPLES:
            lines[0] += " (few: the shares are rough; a longer workload sharpens them)"
        if self.samples:
            lines[0] += f"; shares +-{100 * self.share_error:.0f} points (95%)"
        if self.asleep:
            names = ", ".join(f"{t.split(': ', 1)[-1]} {n}" for t, n in self.asleep.items())
            lines.append(_cut(
                f"  left out: {sum(self.asleep.values())} samples of threads the kernel shows "
                f"asleep ({names}): py-spy counts every thread of a confined server active"
            ))  # fmt: skip
        if not self.top_self and not self.errors:
            lines.append("  (no SGLang frames sampled)")
        for r in self.top_self[:top]:  # names whole: several functions may share a prefix
            hot = ", ".join(f"{n} {share:.0%}" for n, share in r.hot_lines)
            lines.append(
                f"  self {r.self_share:3.0%} total {r.total_share:3.0%} {r.where}"
                + (f" (lines {hot})" if hot else "")
            )
        shown = {r.where for r in self.top_self[:top]}
        rest = [
            f"{_short(r)} {r.total_share:.0%}" for r in self.top_total[:TOP] if r.where not in shown
        ]
        while rest and len("  by total: " + ", ".join(rest)) > 2 * WIDTH:
            rest.pop()  # whole entries, not a name cut short
        if rest:
            lines.append("  by total: " + ", ".join(rest))
        if self.gil is not None:
            lines += _gil_lines(self.gil)
        lines += [_cut(f"  error: {e}") for e in self.errors]
        return lines


class ServerProfile(BaseModel):
    """The `server_profile` tool's record: a workload against one server, its processes'
    profiles and GIL states meanwhile."""

    version: int = 1
    label: str
    """Which server: 'baseline', or the patch looked at and what it changes (`tools.looks`)."""
    workload: str
    """One line: requests, output tokens, seconds."""
    duration_s: float
    """The workload's wall time, seconds."""
    gil_window_s: float | None = None
    """The GIL traces' window (from `SETTLE_S` after the start), seconds; None: none ran."""
    processes: list[ProcessProfile] = Field(default_factory=list)

    def render(self) -> str:
        """Under `RENDER_CHARS`: while longer, the function row of least self time goes (the
        record keeps every row), down to one a process."""
        tops = [min(TOP, len(p.top_self)) for p in self.processes]
        while True:
            text = self._render(tops)
            cuttable = [k for k, n in enumerate(tops) if n > 1]
            if len(text) < RENDER_CHARS or not cuttable:
                return text
            least = min(cuttable, key=lambda k: self.processes[k].top_self[tops[k] - 1].self_share)
            tops[least] -= 1

    def _render(self, tops: list[int]) -> str:
        lines = [f"{self.label}: {self.workload}"]
        for process, top in zip(self.processes, tops, strict=True):
            lines += process.render(top)
        profiled = max((p.duration_s for p in self.processes), default=0.0)
        if self.duration_s and profiled > 1.3 * self.duration_s + 1:  # attached before it began
            lines.append(
                f"note: the profiles ran {profiled:.1f} s, the workload {self.duration_s:.1f} s: "
                "the rest is the server waiting (idle-loop rows are not the workload's)"
            )
        if self.gil_window_s and self.gil_window_s + SETTLE_S > self.duration_s:
            lines.append(
                f"note: the GIL window ({self.gil_window_s:g} s) outlasted the workload "
                f"({self.duration_s:.1f} s): its idle shares include the time after it"
            )
        return "\n".join(lines)


def profile_server(
    server: Server,
    sessions: list[Session],
    load: LoadSpec,
    roles: list[str],
    *,
    label: str,
    gil_s: float | None,
) -> ServerProfile:
    """`trace_during` summarized: each process's hottest functions and its threads' GIL."""
    traces, result = trace_during(server, sessions, load, roles, gil_s=gil_s)
    dirs = package_dirs_of(server)
    return ServerProfile(
        label=label,
        workload=describe(result),
        duration_s=result.duration_s if result is not None else 0.0,
        gil_window_s=gil_s,
        processes=[ProcessProfile.of(t, dirs) for t in traces],
    )


def _wrapper(row: FunctionTime) -> bool:
    """A decorator's closure ('profile_method.<locals>.decorator.<locals>.wrapper'): it carries
    the time of the function it wraps, which is the one to name."""
    return row.function.endswith(".<locals>.wrapper")


def _short(row: FunctionTime) -> str:
    """'scheduler.py:Scheduler.run_batch' (the file's name, not its folders)."""
    return f"{row.file.rsplit('/', 1)[-1]}:{row.function}"


def _gil_lines(report: GilReport) -> list[str]:
    """Who waits for the GIL and who held it (the report's own lines), then the busiest threads'
    states in one line each."""
    blame = [ln for ln in report.render().splitlines() if ln.startswith("thread ")][:1]
    busy = sorted(report.threads, key=lambda t: (-t.holding, t.idle))  # the holder first
    shown = [t for t in busy if t.idle < IDLE][:THREADS] or busy[:1]
    lines = [f"  GIL: {ln}" for ln in blame]
    lines += [f"  GIL {_thread(t, report)}" for t in shown]
    how = "dumps" if report.method.startswith("py-spy dump") else "samples"
    last = [f"{report.snapshots} {how}/{report.duration_s:.0f}s"]
    hidden = [t for t in busy if t not in shown]
    if hidden:
        idle = sum(t.idle >= IDLE for t in hidden)
        more = f"{len(hidden)} more thread{'s' if len(hidden) > 1 else ''}"
        last.append(f"{more} ({idle} idle)")  # idle: at least IDLE of their samples
    if any(w.startswith("no native frames: the process runs") for w in report.warnings):
        last.append("py-spy dumps without native frames (record --native fails in a confined server)")  # fmt: skip
    lines.append("  GIL: " + "; ".join(last))  # one line: the rendering stays bounded
    return [_cut(ln) for ln in lines]


def _cut(line: str, width: int | None = None) -> str:
    width = width or WIDTH
    return line if len(line) <= width else line[: width - 3] + "..."


def _thread(t: ThreadGil, report: GilReport) -> str:
    if not report.gil_visible:
        return f"{t.thread}: active {t.running:.0%} idle {t.idle:.0%}"
    runs = "runs-native" if report.gil_inferred else "runs-no-GIL"
    held = f" (in {', '.join(t.holding_in[:2])})" if t.holding > 0 and t.holding_in else ""
    top = t.top_functions[0] if t.top_functions else "-"
    return (
        f"{t.thread}: holds {t.holding:.0%}{held} waits {t.waiting:.0%} {runs} {t.running:.0%} "
        f"idle {t.idle:.0%}; top {top}"
    )
