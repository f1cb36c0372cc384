"""Profiler timelines: where the time of a running system goes, and what overlaps what.

Python API (stable):
- `profile_callable(fn, repeat=1) -> list[TraceEvent]` (torch.profiler, CPU; CUDA when present),
  `profile_script(argv, trace_path)` for a Python script in a child process (profile.py);
- `load_trace(path) -> list[TraceEvent]` for Kineto/Chrome JSON and nsys SQLite exports
  (events.py);
- `summarize(events, classes=None, overlaps=[(regex_a, regex_b)], cover=0.8) -> TimelineSummary`
  — per-track class breakdown, top ops covering 80%, launch gaps, overlap ratio
  time(A∩B)/time(A) and exposed time of A, warnings (summary.py);
- `diff_summaries(baseline, candidate) -> TimelineDiff` (diff.py);
- `intersection_length`, `covered_fractions`, `union`, `total` interval helpers (intervals.py).
Times are microseconds. Records have `.render()` for a model.
"""

from infra_agent.feedback.timeline.diff import OpChange, TimelineDiff, diff_summaries
from infra_agent.feedback.timeline.events import TraceEvent, load_trace
from infra_agent.feedback.timeline.intervals import (
    covered_fractions,
    intersection_length,
    total,
    union,
)
from infra_agent.feedback.timeline.profile import profile_callable, profile_script
from infra_agent.feedback.timeline.summary import (
    DEFAULT_CLASSES,
    GapStats,
    OpStat,
    Overlap,
    TimelineSummary,
    TrackSummary,
    summarize,
)

__all__ = [
    "DEFAULT_CLASSES",
    "GapStats",
    "OpChange",
    "OpStat",
    "Overlap",
    "TimelineDiff",
    "TimelineSummary",
    "TrackSummary",
    "TraceEvent",
    "covered_fractions",
    "diff_summaries",
    "intersection_length",
    "load_trace",
    "profile_callable",
    "profile_script",
    "summarize",
    "total",
    "union",
]
