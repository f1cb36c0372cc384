"""Inside the server: SGLang's own scheduler step statistics as a per-step timeline and summary.
The records and their rendering are `serving/instruments/step_report.py`.

    spec = instrumented(spec)                         # step lines every decode step, ms clock
    with Server.start(spec, workdir, knobs={**knobs, **STEP_KNOBS}) as server:
        result, report = run_with_steps(server, sessions, load, cap=4)
    report.render()   # "queueing: up to 28 requests waited behind 4 running (max-running-..."

The source is the scheduler's log (SGLang 0.5.23, `managers/scheduler_components/
metrics_reporter.py`): once a step's result is processed it writes `Prefill batch [12], #new-seq:
1, #new-token: 64, #cached-token: 0, token usage: 0.00, #running-req: 3, #queue-req: 27, ...` for
a prefill and, every `--decode-log-interval` decode steps (1 here: every step), `Decode batch
[13], #running-req: 4, #token: 310, token usage: 0.01, cpu graph: False, gen throughput
(token/s): 130.12, #queue-req: 27`. `SGLANG_LOG_MS=1` gives the timestamps milliseconds and
`SGLANG_LOG_FORWARD_ITERS=1` the forward-step number in brackets. The Prometheus gauges of
`--enable-metrics` (`sglang:num_running_reqs`, `sglang:num_queue_reqs`) are set in the same two
places and hold one value per scrape, so the log is the per-step source.

A step's time is the scheduler's cycle (scheduling, forward, result processing) read from the
gaps between lines. Without the overlap scheduler a step's line follows its own forward, so the
step took the gap since the previous line; with it (SGLang's default, on the CPU too) the line of
step k is written after step k+1's forward, so step k+1 took the gap that ends at line k. The time
is unknown (None) where the lines before it are not consecutive forward steps or an idle gap
(more than IDLE_FACTOR times the median gap) lies in between.
"""

from __future__ import annotations

import re
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from infra_agent.serving.deployment import ArgValue, DeploymentSpec
from infra_agent.serving.instruments.step_report import Bucket, SchedulerStep, StepKind, StepReport

STEP_KNOBS: dict[str, ArgValue] = {"decode-log-interval": 1}
"""Server arguments of an instrumented server: a step line after every decode step."""
STEP_ENV = {"SGLANG_LOG_MS": "1", "SGLANG_LOG_FORWARD_ITERS": "1"}
"""Environment of an instrumented server: millisecond timestamps and forward-step numbers."""
MAX_STEPS = 5000
"""Steps kept in a report's record (the summary counts all of them)."""
TIMELINE_BUCKETS = 10
LOG_SETTLE_S = 0.5
IDLE_FACTOR = 5.0

_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:\.(?P<frac>\d{1,6}))?[^\]]*\]\s*"
    r"(?P<kind>Prefill|Decode) batch(?: \[(?P<iter>\d+)\])?[,.]\s*(?P<rest>.*)$"
)


_RETRACT = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<n>\d+)")
"""SGLang 0.5.23's warning when a decode step finds the KV pool full and sends requests back to
the queue (`Scheduler.update_running_batch`): their KV is freed and recomputed on readmission."""


def _fields(rest: str) -> dict[str, str]:
    out = {}
    for part in rest.split(","):
        key, sep, value = part.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _int(fields: dict[str, str], key: str, default: int = 0) -> int:
    try:
        return int(float(fields[key]))
    except (KeyError, ValueError):
        return default


def _float(fields: dict[str, str], key: str) -> float | None:
    try:
        return float(fields[key])
    except (KeyError, ValueError):
        return None


def parse_retractions(text: str) -> list[int]:
    """Requests retracted by each retraction the log reports (KV pool full), in order."""
    return [int(m["n"]) for m in _RETRACT.finditer(text)]


def parse_steps(text: str) -> tuple[list[SchedulerStep], bool]:
    """The step lines of a server log, in order, and whether timestamps had milliseconds.
    Other lines are skipped; `duration_ms` is filled by `summarize`."""
    steps: list[SchedulerStep] = []
    ms_clock = False
    t_first: float | None = None
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        t = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S").timestamp()
        if m["frac"]:
            ms_clock = True
            t += float("0." + m["frac"])
        t_first = t if t_first is None else t_first
        f = _fields(m["rest"])
        kind = StepKind.PREFILL if m["kind"] == "Prefill" else StepKind.DECODE
        running = _int(f, "#running-req")
        steps.append(
            SchedulerStep(
                t_s=round(t - t_first, 6),
                kind=kind,
                running=running,
                queued=_int(f, "#queue-req"),
                tokens=_int(f, "#new-token") if kind is StepKind.PREFILL else running,
                new_seqs=_int(f, "#new-seq"),
                cached_tokens=_int(f, "#cached-token"),
                kv_tokens=_int(f, "#token") if kind is StepKind.DECODE else None,
                kv_usage=_float(f, "token usage"),
                iteration=int(m["iter"]) if m["iter"] else None,
            )
        )
    return steps, ms_clock


def _fill_durations(steps: list[SchedulerStep], overlap: bool) -> None:
    """Step times from the gaps between lines (see the module docstring)."""
    if len(steps) < 2:
        return
    gaps = [(b.t_s - a.t_s) * 1e3 for a, b in zip(steps, steps[1:], strict=False)]
    idle = IDLE_FACTOR * max(statistics.median(gaps), 1.0)

    def follows(i: int) -> bool:  # step i is the forward step right after step i-1, no idle
        a, b = steps[i - 1], steps[i]
        consecutive = a.iteration is None or b.iteration is None or b.iteration == a.iteration + 1
        return consecutive and gaps[i - 1] <= idle

    for i, step in enumerate(steps):
        if overlap:  # line i-1 was written after step i ran: the gap before it is step i's
            if i >= 2 and follows(i - 1) and follows(i):
                step.duration_ms = round(gaps[i - 2], 3)
        elif i >= 1 and follows(i):
            step.duration_ms = round(gaps[i - 1], 3)


def _timeline(steps: list[SchedulerStep], buckets: int) -> list[Bucket]:
    end = steps[-1].t_s
    width = max(end / buckets, 1e-3)
    out = []
    for i in range(buckets):
        t0, t1 = i * width, (i + 1) * width
        inside = [s for s in steps if t0 <= s.t_s < t1 or (i == buckets - 1 and s.t_s >= t0)]
        if not inside:
            continue
        dec = [s for s in inside if s.kind is StepKind.DECODE]
        times = [s.duration_ms for s in dec if s.duration_ms is not None]
        out.append(
            Bucket(
                t0_s=round(t0, 3),
                t1_s=round(t1, 3),
                decode_steps=len(dec),
                prefill_steps=len(inside) - len(dec),
                running_max=max(s.running for s in inside),
                queued_first=inside[0].queued,
                queued_last=inside[-1].queued,
                decode_ms_median=round(statistics.median(times), 2) if times else None,
                prefill_tokens=sum(s.tokens for s in inside if s.kind is StepKind.PREFILL),
            )
        )
    return out


def summarize(
    steps: list[SchedulerStep],
    *,
    cap: int | None,
    source: str,
    ms_clock: bool = True,
    overlap: bool = True,
    retractions: list[int] | None = None,
) -> StepReport:
    """The report of a run's steps; `cap` is the server's max-running-requests (None: unknown),
    `overlap` whether its overlap scheduler was on (SGLang's default)."""
    if ms_clock:
        _fill_durations(steps, overlap)
    dec = [s for s in steps if s.kind is StepKind.DECODE]
    pre = [s for s in steps if s.kind is StepKind.PREFILL]
    queued = [s for s in dec if s.queued > 0]
    measured: dict[int, list[float]] = {}
    for s in dec:
        if s.duration_ms is not None:
            measured.setdefault(s.running, []).append(s.duration_ms)
    all_measured = [ms for v in measured.values() for ms in v]
    iters = sorted({s.iteration for s in steps if s.iteration is not None})
    unlogged = (iters[-1] - iters[0] + 1 - len(iters)) if iters else 0
    return StepReport(
        source=source,
        cap=cap,
        window_s=steps[-1].t_s - steps[0].t_s if steps else 0.0,
        decode_steps=len(dec),
        prefill_steps=len(pre),
        running_max=max((s.running for s in steps), default=0),
        queued_max=max((s.queued for s in steps), default=0),
        queued_decode_steps=len(queued),
        queued_at_cap_steps=sum(1 for s in queued if cap and s.running >= cap),
        decode_ms_median=statistics.median(all_measured) if all_measured else None,
        decode_ms_by_running={
            r: (round(statistics.median(v), 2), len(v)) for r, v in sorted(measured.items())
        },
        prefill_tokens_median=statistics.median([s.tokens for s in pre]) if pre else None,
        prefill_tokens_max=max((s.tokens for s in pre), default=0),
        decode_ms_total=sum(s.duration_ms or 0.0 for s in dec),
        prefill_ms_total=sum(s.duration_ms or 0.0 for s in pre),
        decode_timed=sum(1 for s in dec if s.duration_ms is not None),
        prefill_timed=sum(1 for s in pre if s.duration_ms is not None),
        ms_clock=ms_clock,
        overlap=overlap,
        unlogged_iterations=unlogged,
        kv_usage_max=max((s.kv_usage for s in steps if s.kv_usage is not None), default=None),
        retractions=len(retractions or []),
        retracted_requests=sum(retractions or []),
        timeline=_timeline(steps, TIMELINE_BUCKETS) if steps else [],
        steps=steps[:MAX_STEPS],
        steps_dropped=max(0, len(steps) - MAX_STEPS),
    )


def read_report(text: str, *, cap: int | None, source: str, overlap: bool = True) -> StepReport:
    """Parse a server log's step lines and summarize them."""
    steps, ms_clock = parse_steps(text)
    return summarize(
        steps, cap=cap, source=source, ms_clock=ms_clock, overlap=overlap,
        retractions=parse_retractions(text),
    )  # fmt: skip


def instrumented(spec: DeploymentSpec) -> DeploymentSpec:
    """The deployment with the step-log environment (pass STEP_KNOBS with its knobs)."""
    return spec.model_copy(update={"env": {**spec.env, **STEP_ENV}})


def server_settings(server: Any, knobs: dict[str, Any]) -> tuple[int | None, bool]:
    """(max-running-requests, overlap scheduler on) as the running server reports them; the cap
    as the knobs set it when the server does not say."""
    info = server.info()
    value = info.get("max_running_requests") or knobs.get("max-running-requests")
    try:
        cap = int(value) if value else None
    except (TypeError, ValueError):
        cap = None
    return cap, not info.get("disable_overlap_schedule", False)


def run_with_steps(
    server: Any, sessions: list[Any], load: Any, *, knobs: dict[str, Any]
) -> tuple[Any, StepReport]:
    """Run a workload on an instrumented server started with `knobs`; (WorkloadResult, the
    steps it caused)."""
    from infra_agent.serving.load.generator import run_workload

    cap, overlap = server_settings(server, knobs)
    log: Path = server.log_path
    start = log.stat().st_size
    result = server.call(run_workload, sessions, load)
    time.sleep(LOG_SETTLE_S)  # the last step's line may follow the last response
    with log.open("rb") as fh:
        fh.seek(start)
        text = fh.read().decode(errors="replace")
    report = read_report(text, cap=cap, source=f"{log.name} (workload lines)", overlap=overlap)
    return result, report
