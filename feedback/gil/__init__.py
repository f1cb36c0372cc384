"""GIL and stack tracer: which threads hold the GIL, which wait for it, and who is to blame.

Python API (stable):
- `trace_pid(pid, duration_s=5, interval_s=1.0, native=True) -> GilReport` — attach with
  py-spy (`dump --json --native`, repeated; each dump pauses the target briefly);
- `trace_command(argv, duration_s=5, startup_s=0.5) -> GilReport` — start a command, sample it,
  stop it; for a Python script whose process py-spy cannot attach to, falls back to in-process
  sampling (marked `gil_visible=False`);
- `InProcessSampler` — sample this process's threads (no GIL visibility);
- `analyze(snapshots, method=..., duration_s=...)` — shares and blame from any snapshots.
`GilReport.render()`: the most-waiting thread and who held the GIL meanwhile, first.
"""

from infra_agent.feedback.gil.analysis import (
    Frame,
    GilReport,
    HolderEvidence,
    ThreadBlame,
    ThreadGil,
    ThreadSample,
    analyze,
    classify,
)
from infra_agent.feedback.gil.inprocess import InProcessSampler
from infra_agent.feedback.gil.pyspy import PySpyUnavailable, dump_once, parse_dump, sample_pid
from infra_agent.feedback.gil.trace import trace_command, trace_pid

__all__ = [
    "Frame",
    "GilReport",
    "HolderEvidence",
    "InProcessSampler",
    "PySpyUnavailable",
    "ThreadBlame",
    "ThreadGil",
    "ThreadSample",
    "analyze",
    "classify",
    "dump_once",
    "parse_dump",
    "sample_pid",
    "trace_command",
    "trace_pid",
]
