"""Summarize a timeline: `summarize(events, classes=..., overlaps=[("kv_transfer", "dispatch")])`.

- Per track (host thread or device stream): span, busy, idle, and time per class. Host ops nest
  (aten::linear contains aten::addmm), so each instant counts once, for the innermost event
  (its *self* time). Classes are regular expressions over event names, first match wins;
  unmatched time is `compute`. Defaults: `DEFAULT_CLASSES`.
- Top operations by self time, covering `cover` (80%) of it: count, total, share, p50, p90.
  Device kernels when the trace has any, host ops otherwise; annotations are left out.
- Launch gaps: idle time between consecutive kernels on each device stream (between top-level
  ops on each host thread for CPU-only traces).
- Overlap of user classes A and B: time(A ∩ B) / time(A) by an interval sweep over all tracks,
  and the exposed time of A, time(A) - time(A ∩ B).
- `warnings` say when a measure means little (a class matching nothing, A and B on one stream,
  CUDA-graph replays, a very short trace).
All times are microseconds.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.feedback.timeline.events import TraceEvent
from infra_agent.feedback.timeline.intervals import intersection_length, total, union
from infra_agent.judgement.describe import percentile

DEFAULT_CLASSES: dict[str, str] = {
    "comm": r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|broadcast|c10d|"
    r"\bsend\b|\brecv\b",
    "memcpy": r"[Mm]emcpy|[Mm]emset|aten::copy_|aten::_to_copy|aten::to\b",
    "host_wait": r"[Ss]ynchronize|StreamWaitEvent|\bwait\b",
}
ANNOTATION_CATEGORIES = {"user_annotation", "gpu_user_annotation"}


class TrackSummary(BaseModel):
    track: str
    on_device: bool
    span_us: float
    busy_us: float
    idle_us: float
    classes_us: dict[str, float] = Field(default_factory=dict)
    """Class name -> self time (compute, comm, memcpy, host_wait, or user classes)."""
    top_op: str = ""
    """The op (not an annotation) with the most self time on this track."""


class OpStat(BaseModel):
    name: str
    count: int
    total_us: float
    """Self time summed over calls."""
    share: float
    """Of all self time of its kind (device or host)."""
    p50_us: float
    p90_us: float


class GapStats(BaseModel):
    track: str
    count: int
    total_us: float
    p50_us: float
    p90_us: float
    max_us: float


class Overlap(BaseModel):
    a: str
    b: str
    """The two regular expressions."""
    time_a_us: float
    time_b_us: float
    overlap_us: float
    ratio: float | None
    """time(A ∩ B) / time(A); None when A matched nothing."""
    exposed_a_us: float
    """Time of A not hidden under B."""


class TimelineSummary(BaseModel):
    source: str = ""
    span_us: float
    events: int
    tracks: list[TrackSummary] = Field(default_factory=list)
    top_ops: list[OpStat] = Field(default_factory=list)
    """Ops covering `cover` of self time, largest first."""
    ops: list[OpStat] = Field(default_factory=list)
    """All ops (up to 300), for diffs."""
    ops_kind: str = "host"
    """'device' (kernels) or 'host' (CPU ops)."""
    launch_gaps: list[GapStats] = Field(default_factory=list)
    overlaps: list[Overlap] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)

    def render(self, max_ops: int = 8) -> str:
        lines = []
        for o in self.overlaps:
            ratio = "n/a" if o.ratio is None else f"{o.ratio:.1%}"
            lines.append(
                f"overlap {o.a!r} under {o.b!r}: {ratio} of {o.time_a_us / 1e3:.3f} ms; "
                f"exposed {o.exposed_a_us / 1e3:.3f} ms"
            )
        lines.append(
            f"span {self.span_us / 1e3:.3f} ms, {self.events} events, {len(self.tracks)} tracks"
        )
        for t in sorted(self.tracks, key=lambda t: -t.busy_us)[:4]:
            cls = ", ".join(
                f"{k} {v / t.busy_us:.0%}" for k, v in t.classes_us.items() if v > 0 and t.busy_us
            )
            idle = t.idle_us / t.span_us if t.span_us else 0.0
            top = f"; top {t.top_op[:40]}" if t.top_op else ""
            lines.append(
                f"{'dev' if t.on_device else 'host'} {t.track}: busy {t.busy_us / 1e3:.3f} ms "
                f"({cls}){top}; idle {idle:.0%}"
            )
        lines.append(f"top {self.ops_kind} ops (self time):")
        for op in self.top_ops[:max_ops]:
            lines.append(
                f"  {op.share:5.1%} {op.name[:60]} x{op.count} total {op.total_us / 1e3:.3f} ms "
                f"p50 {op.p50_us:.1f} us p90 {op.p90_us:.1f} us"
            )
        for g in self.launch_gaps[:2]:
            lines.append(
                f"gaps on {g.track}: {g.count} totalling {g.total_us / 1e3:.3f} ms "
                f"(p50 {g.p50_us:.1f} us, p90 {g.p90_us:.1f} us, max {g.max_us:.1f} us)"
            )
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def _self_times(events: list[TraceEvent]) -> list[float]:
    """Self time of each event of one track: its duration minus its direct children's."""
    order = sorted(range(len(events)), key=lambda i: (events[i].start_us, -events[i].dur_us))
    self_t = [e.dur_us for e in events]
    stack: list[int] = []
    for i in order:
        e = events[i]
        while stack and events[stack[-1]].end_us <= e.start_us:
            stack.pop()
        if stack:
            parent = stack[-1]
            self_t[parent] -= min(e.end_us, events[parent].end_us) - e.start_us
        stack.append(i)
    return [max(0.0, t) for t in self_t]


def _classify(name: str, patterns: list[tuple[str, re.Pattern[str]]]) -> str:
    for cls, pattern in patterns:
        if pattern.search(name):
            return cls
    return "compute"


def _compile(exprs: dict[str, str]) -> list[tuple[str, re.Pattern[str]]]:
    try:
        return [(name, re.compile(expr)) for name, expr in exprs.items()]
    except re.error as exc:
        raise UserError(f"bad event-class regular expression: {exc}") from exc


def _gap_stats(track: str, events: list[TraceEvent]) -> GapStats | None:
    merged = union((e.start_us, e.end_us) for e in events)
    gaps = [b[0] - a[1] for a, b in zip(merged, merged[1:], strict=False)]
    if not gaps:
        return None
    g = np.asarray(gaps)
    return GapStats(
        track=track,
        count=len(gaps),
        total_us=float(g.sum()),
        p50_us=percentile(g, 50),
        p90_us=percentile(g, 90),
        max_us=float(g.max()),
    )


def _op_stats(samples: dict[str, list[float]], cover: float) -> tuple[list[OpStat], list[OpStat]]:
    grand = sum(sum(v) for v in samples.values()) or 1.0
    ops = sorted(
        (
            OpStat(
                name=name,
                count=len(v),
                total_us=float(sum(v)),
                share=float(sum(v)) / grand,
                p50_us=percentile(v, 50),
                p90_us=percentile(v, 90),
            )
            for name, v in samples.items()
        ),
        key=lambda o: -o.total_us,
    )
    top: list[OpStat] = []
    acc = 0.0
    for op in ops:
        if acc >= cover or len(top) >= 15:
            break
        top.append(op)
        acc += op.share
    return top, ops[:300]


def summarize(
    events: Sequence[TraceEvent],
    *,
    classes: dict[str, str] | None = None,
    overlaps: Sequence[tuple[str, str]] = (),
    cover: float = 0.8,
    source: str = "",
) -> TimelineSummary:
    """Summarize events (see the module docstring). `classes` replaces `DEFAULT_CLASSES`."""
    if not events:
        raise UserError("the trace has no complete events to summarize")
    patterns = _compile(DEFAULT_CLASSES if classes is None else classes)
    by_track: dict[str, list[TraceEvent]] = defaultdict(list)
    for e in events:
        by_track[e.track].append(e)
    has_device = any(e.on_device for e in events)
    op_samples: dict[str, list[float]] = defaultdict(list)
    summary = TimelineSummary(
        source=source,
        span_us=max(e.end_us for e in events) - min(e.start_us for e in events),
        events=len(events),
        ops_kind="device" if has_device else "host",
    )
    for track, evs in sorted(by_track.items()):
        span = max(e.end_us for e in evs) - min(e.start_us for e in evs)
        busy = total((e.start_us, e.end_us) for e in evs)
        cls_time: dict[str, float] = defaultdict(float)
        track_ops: dict[str, float] = defaultdict(float)
        for e, self_us in zip(evs, _self_times(evs), strict=True):
            cls_time[_classify(e.name, patterns)] += self_us
            if e.category not in ANNOTATION_CATEGORIES:
                track_ops[e.name] += self_us
                if e.on_device == has_device:
                    op_samples[e.name].append(self_us)
        summary.tracks.append(
            TrackSummary(
                track=track,
                on_device=evs[0].on_device,
                span_us=span,
                busy_us=busy,
                idle_us=span - busy,
                classes_us=dict(cls_time),
                top_op=max(track_ops, key=track_ops.__getitem__, default=""),
            )
        )
        gap_events = [e for e in evs if e.category not in ANNOTATION_CATEGORIES]
        if (evs[0].on_device or not has_device) and gap_events:
            stats = _gap_stats(track, gap_events)
            if stats is not None:
                summary.launch_gaps.append(stats)
    summary.launch_gaps.sort(key=lambda g: -g.total_us)
    summary.top_ops, summary.ops = _op_stats(op_samples, cover)
    for a, b in overlaps:
        summary.overlaps.append(_overlap(events, a, b, summary.warnings))
    _general_warnings(events, summary, has_device)
    return summary


def _overlap(events: Sequence[TraceEvent], a: str, b: str, warnings: list[str]) -> Overlap:
    (_, pa), (_, pb) = _compile({"a": a, "b": b})
    ev_a = [e for e in events if pa.search(e.name)]
    ev_b = [e for e in events if pb.search(e.name)]
    ia = [(e.start_us, e.end_us) for e in ev_a]
    ib = [(e.start_us, e.end_us) for e in ev_b]
    time_a, time_b = total(ia), total(ib)
    inter = intersection_length(ia, ib)
    if not ev_a:
        warnings.append(f"class {a!r} matched no events: overlap ratio undefined")
    if not ev_b:
        warnings.append(f"class {b!r} matched no events: overlap is 0 by construction")
    tracks_a, tracks_b = {e.track for e in ev_a}, {e.track for e in ev_b}
    if ev_a and ev_b and len(tracks_a | tracks_b) == 1:
        where = next(iter(tracks_a))
        if ev_a[0].on_device:
            warnings.append(f"{a!r} and {b!r} run on one stream ({where}): they cannot overlap")
        else:
            warnings.append(
                f"{a!r} and {b!r} are on one thread ({where}): overlap there means nesting, "
                "not concurrency"
            )
    return Overlap(
        a=a,
        b=b,
        time_a_us=time_a,
        time_b_us=time_b,
        overlap_us=inter,
        ratio=inter / time_a if time_a > 0 else None,
        exposed_a_us=time_a - inter,
    )


def _general_warnings(
    events: Sequence[TraceEvent], summary: TimelineSummary, has_device: bool
) -> None:
    if any("GraphLaunch" in e.name for e in events):
        streams = {e.track for e in events if e.on_device}
        summary.warnings.append(
            f"CUDA-graph replays present ({len(streams)} device streams): kernels inside a graph "
            "launch back to back, so launch gaps and per-stream overlap say little about them"
        )
    if summary.span_us < 1000:
        summary.warnings.append(f"trace spans only {summary.span_us:.0f} us: shares are noisy")
    if not has_device:
        summary.warnings.append("no device activity in the trace: host-side view only")
