"""Where a running Python process spends its time, by function: `py-spy record` on a live pid.

    profile = profile_pid(pid, duration_s=10)          # samples of active threads, not paused
    profile.functions(within=[sglang_dir])             # FunctionTime rows, hottest first

Each sample is one active (not idle) thread's stack. A function's *self* share counts the samples
whose innermost frame *inside the given folders* is that function: time in libraries it calls
(torch ops, the interpreter) is charged to the workspace function that called them, which is what
an engineer patching that code wants to know. Its *total* share counts the samples with the
function anywhere on the stack. `FunctionProfile.render()` is the short face.
"""

from __future__ import annotations

import math
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.feedback.gil.pyspy import PySpyUnavailable, find_py_spy
from infra_agent.feedback.gil.threads import KernelThread, kernel_threads, own_pid_namespace
from infra_agent.judgement.intervals import binom_upper_tail

FRAME = re.compile(r"^(?P<name>.+) \((?P<file>.+):(?P<line>\d+)\)$")
NESTED = re.compile(r"(?:\.<locals>\.<(?:lambda|listcomp|dictcomp|setcomp|genexpr)>)+$")
"""A lambda or comprehension inside a function: its code is part of that function's body."""
HOT_LINES = 3
"""Lines kept per function (`FunctionTime.hot_lines`)."""
WORKER_PREFIX = "_infra_"
"""The experiment worker's own files beside a task's code in a sandbox copy start so
(experiments/worker.py): never the task's code, so never a profile's answer (a pd-kv-reuse-race
diagnosis once named the worker's frame reader, seen only in the run with aborts)."""


class FunctionTime(BaseModel):
    """One function's share of a profile."""

    function: str
    """Qualified name as py-spy reads it, e.g. 'Scheduler.get_new_batch_prefill'."""
    file: str
    """Path relative to the folder it was found in (e.g. 'sglang/srt/managers/scheduler.py')."""
    self_samples: int
    total_samples: int
    self_share: float
    """Self samples / all active samples of the profile."""
    total_share: float
    hot_lines: list[tuple[int, float]] = Field(default_factory=list)
    """Its hottest lines by self time: (line number, share of all active samples), at most
    `HOT_LINES`, hottest first."""

    @property
    def where(self) -> str:
        """'file:function', the form localizations use."""
        return f"{self.file}:{self.function}"


class FunctionProfile(BaseModel):
    pid: int
    duration_s: float
    samples: int
    """Active-thread samples recorded."""
    stacks: dict[str, int] = Field(default_factory=dict, repr=False)
    """Collapsed stacks ('thread;frame;...;frame') -> samples, as py-spy wrote them."""
    asleep: dict[str, int] = Field(default_factory=dict)
    """Threads left out ('thread (8): name' -> samples): py-spy counted them active, but they
    used under `ASLEEP_CPU_SHARE` of the window's CPU time (a process in a pid namespace of its
    own, whose thread states py-spy cannot read: `feedback.gil.threads`)."""

    def functions(self, within: list[Path], limit: int = 20) -> list[FunctionTime]:
        """Functions whose file is under one of `within`, hottest by self share first."""
        roots = [str(p.resolve()) + "/" for p in within]
        selfs: Counter[tuple[str, str]] = Counter()
        totals: Counter[tuple[str, str]] = Counter()
        lines: dict[tuple[str, str], Counter[int]] = {}
        for stack, count in self.stacks.items():
            frames = [_frame(f, roots) for f in stack.split(";")[1:]]
            mine = [f for f in frames if f is not None]
            if not mine:
                continue
            name, file, line = mine[-1]
            selfs[(name, file)] += count
            lines.setdefault((name, file), Counter())[line] += count
            for key in {(n, f) for n, f, _ in mine}:
                totals[key] += count
        total = max(self.samples, 1)
        rows = [
            FunctionTime(
                function=name,
                file=file,
                self_samples=selfs[(name, file)],
                total_samples=n,
                self_share=selfs[(name, file)] / total,
                total_share=n / total,
                hot_lines=[
                    (line, k / total)
                    for line, k in lines.get((name, file), Counter()).most_common(HOT_LINES)
                ],
            )  # fmt: skip
            for (name, file), n in totals.items()
        ]
        rows.sort(key=lambda r: (r.self_samples, r.total_samples), reverse=True)
        return rows[:limit]

    def inclusive(self, within: list[Path]) -> dict[str, int]:
        """'file:function' -> samples with the function anywhere on the stack (once per sample)."""
        roots = [str(p.resolve()) + "/" for p in within]
        totals: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            frames = {found[:2] for f in stack.split(";")[1:] if (found := _frame(f, roots))}
            for name, file in frames:
                totals[f"{file}:{name}"] += count
        return dict(totals)

    def depths(self, within: list[Path]) -> dict[str, float]:
        """'file:function' -> its mean depth among the frames under `within` (0: outermost),
        weighted by samples: of functions with equal total time, the deeper is the callee."""
        roots = [str(p.resolve()) + "/" for p in within]
        weighted: Counter[str] = Counter()
        seen: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            mine = [f for f in (_frame(f, roots) for f in stack.split(";")[1:]) if f is not None]
            for depth, (name, file, _) in enumerate(mine):
                weighted[f"{file}:{name}"] += depth * count
                seen[f"{file}:{name}"] += count
        return {where: weighted[where] / seen[where] for where in seen}

    def render(self, within: list[Path], limit: int = 8) -> str:
        rows = self.functions(within, limit)
        head = f"pid {self.pid}: {self.samples} active samples in {self.duration_s:.1f} s"
        lines = [f"  {r.self_share:6.1%} self {r.total_share:6.1%} total  {r.where}" for r in rows]
        return "\n".join([head, *lines])


def _frame(text: str, roots: list[str]) -> tuple[str, str, int] | None:
    """(function, file relative to its root's parent, line); None for a frame outside `roots`."""
    match = FRAME.match(text)
    if match is None:
        return None
    path = match["file"]
    if Path(path).name.startswith(WORKER_PREFIX):
        return None
    for root in roots:
        if path.startswith(root):
            # Relative to the folder's parent: 'sglang/srt/...' for root '.../sglang/'.
            parent = str(Path(root).parent) + "/"
            return NESTED.sub("", match["name"]), path[len(parent) :], int(match["line"])
    return None


ATTACHED = "Sampling process"  # py-spy record's first line once it samples the target
CTRL_C_AFTER_S = 0.5
"""py-spy prints ATTACHED just before it installs its Ctrl-C handler (`record_samples` in its
main.rs: println!, the progress bar, then ctrlc::set_handler): a Ctrl-C sooner than this after
the line can kill it before it saves anything (seen once in a full suite run)."""


def profile_pid(
    pid: int,
    *,
    duration_s: float = 10.0,
    rate: int = 50,
    until: Callable[[], bool] | None = None,
    on_attach: Callable[[], None] | None = None,
) -> FunctionProfile:
    """Record `pid`'s active threads for up to `duration_s`, or until `until()` turns true (py-spy,
    non-blocking: the target is never paused). `on_attach` is called once py-spy samples, so
    work started there is seen from its first moment; `until` is not asked before then (a
    Ctrl-C before py-spy attaches leaves no file). Raises PySpyUnavailable when py-spy cannot
    attach or records nothing."""
    limit = max(1, math.ceil(duration_s))
    with tempfile.TemporaryDirectory(prefix="infra-agent-profile-") as tmp:
        out = Path(tmp) / "raw.txt"
        argv = [find_py_spy(), "record", "--pid", str(pid), "--rate", str(rate)]
        argv += ["--duration", str(limit), "--format", "raw", "--nonblocking", "--threads"]
        argv += ["--full-filenames", "-o", str(out)]
        # In its own pid namespace py-spy cannot read thread states: every thread is "active".
        before = kernel_threads(pid) if own_pid_namespace(pid) else None
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        settled = threading.Event()  # py-spy attached, or its output ended

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if ATTACHED in line:
                    settled.set()
            settled.set()

        reader = threading.Thread(target=read, name="py-spy-output", daemon=True)
        reader.start()
        try:
            settled.wait(timeout=limit + 30)
            attached = any(ATTACHED in line for line in lines)
            if attached and on_attach is not None:
                on_attach()
            may_stop = time.monotonic() + CTRL_C_AFTER_S
            while proc.poll() is None and time.monotonic() - started < limit + 30:
                if until is not None and attached and time.monotonic() >= may_stop and until():
                    proc.send_signal(signal.SIGINT)  # py-spy writes what it has on Ctrl-C
                    break
                time.sleep(0.1)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader.join(timeout=5)
        elapsed = time.monotonic() - started
        if not out.is_file():
            tail = "".join(lines).strip().splitlines()[-1:] or ["no output"]
            raise PySpyUnavailable(f"py-spy cannot record pid {pid}: {tail[0][:200]}")
        stacks: dict[str, int] = {}
        for line in out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                stacks[stack] = stacks.get(stack, 0) + int(count)
    asleep: dict[str, int] = {}
    if before is not None:
        stacks, asleep = _drop_asleep(stacks, before, kernel_threads(pid), elapsed)
    return FunctionProfile(
        pid=pid, duration_s=round(min(elapsed, limit), 2), samples=sum(stacks.values()),
        stacks=stacks, asleep=asleep,
    )  # fmt: skip


ASLEEP_CPU_SHARE = 0.02
"""A thread that used less CPU time than this share of the profile's window was asleep."""
THREAD_LABEL = re.compile(r"^thread \((\d+)\)")


def _drop_asleep(
    stacks: dict[str, int],
    before: dict[int, KernelThread],
    after: dict[int, KernelThread],
    elapsed_s: float,
) -> tuple[dict[str, int], dict[str, int]]:
    """(the stacks of threads that ran, samples of the asleep ones by thread label): a thread's
    CPU time over the window from the kernel, by the id py-spy labels it with."""
    kept: dict[str, int] = {}
    asleep: Counter[str] = Counter()
    for stack, count in stacks.items():
        label = stack.split(";", 1)[0]
        match = THREAD_LABEL.match(label)
        tid = int(match[1]) if match else None
        if tid in before and tid in after:
            used = after[tid].cpu_s - before[tid].cpu_s
            if used < ASLEEP_CPU_SHARE * elapsed_s:
                asleep[label] += count
                continue
        kept[stack] = count
    return kept, dict(asleep)


def growing_function(
    low: FunctionProfile,
    high: FunctionProfile,
    within: list[Path],
    *,
    low_units: float,
    high_units: float,
    share: float = 0.6,
) -> tuple[str, float, float] | None:
    """The function whose time per unit of work grows most from `low` to `high`, at the deepest
    level that still accounts for `share` of the largest growth (a callee that carries its
    caller's growth is the better answer). Returns ('file:function', per-unit samples at low,
    at high), or None when nothing grows."""
    a = {k: v / max(low_units, 1e-9) for k, v in low.inclusive(within).items()}
    b = {k: v / max(high_units, 1e-9) for k, v in high.inclusive(within).items()}
    growth = {k: b[k] - a.get(k, 0.0) for k in b}
    if not growth or max(growth.values()) <= 0:
        return None
    top = max(growth.values())
    carriers = [k for k, g in growth.items() if g >= share * top]
    deepest = min(carriers, key=lambda k: b[k])
    return deepest, a.get(deepest, 0.0), b[deepest]


def function_only_in(
    low: FunctionProfile,
    high: FunctionProfile,
    within: list[Path],
    *,
    low_units: float,
    high_units: float,
    odds: float = 1e-4,
) -> tuple[str, float, float] | None:
    """`growing_function`'s answer only when that function runs (almost) only in `high`: per unit
    of work at least 5 times its samples in `low`, and a split of its samples that lopsided would
    come by chance with probability below `odds` were its time per unit the same in both
    (binomial tail). A function that runs once in each run (a constructor a loaded machine
    happened to stretch in one) is not named for a handful of samples: with equal units and none
    in `low`, 14 samples in `high` are needed (0.5**14 = 6e-5)."""
    found = growing_function(low, high, within, low_units=low_units, high_units=high_units)
    if found is None:
        return None
    where, per_low, per_high = found
    if per_low > per_high / 5:
        return None
    k_low, k_high = round(per_low * low_units), round(per_high * high_units)
    p = high_units / (low_units + high_units)  # a sample's chance to fall in `high` under H0
    n = k_low + k_high
    return found if binom_upper_tail(k_high, n, p) < odds else None


def profile_while(
    pid: int, work: Callable[[], object], *, rate: int = 100, limit_s: float = 120.0
) -> tuple[FunctionProfile, object]:
    """Profile `pid` while `work()` runs on another thread of this process; returns the profile
    and what `work` returned (its exception is re-raised)."""
    done = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run, name="infra-agent-profiled-work", daemon=True)
    try:  # the work starts once py-spy samples: a short workload is not over before it attaches
        profile = profile_pid(
            pid, duration_s=limit_s, rate=rate, until=done.is_set, on_attach=thread.start
        )
    finally:
        if thread.ident is not None:
            thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return profile, box.get("result")


def python_descendant(pid: int) -> int:
    """The first process at or below `pid` running Python (a sandbox may wrap the one to
    profile in bubblewrap or setpriv)."""
    todo = [pid]
    while todo:
        current = todo.pop(0)
        try:
            cmdline = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if "python" in Path(cmdline.decode(errors="replace")).name:
            return current
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return pid
