"""GIL and stack tracer: which threads hold the GIL, which wait for it, and who is to blame.

Python API (stable):
- `trace_pid(pid, duration_s=5, interval_s=None, native=True, sampler=None) -> GilReport` —
  attach with py-spy. Default sampler `record`: two long-lived `py-spy record`s per trace
  (native stacks at 10/s, blocking; GIL owner only, non-blocking): one pause of ~0.1-0.3 s on
  the first sample while native symbols load, then ~1 ms per sample; blame names who held the
  GIL over the trace. `sampler="dump"`: a fresh `py-spy dump --json [--native]` per snapshot
  (1/s; holders at the same instants as the waits, but each native dump pauses the target
  ~0.1-0.3 s). Without native frames or with `nonblocking`, dumps (no pause, no GIL waits);
  when `record` fails (native unwinding across a sandbox), non-pausing dumps;
- `trace_command(argv, duration_s=5, startup_s=0.5, sampler=None) -> GilReport` — start a
  command, sample it, stop it; for a Python script whose process py-spy cannot attach to,
  falls back to in-process sampling (marked `gil_visible=False`);
- `InProcessSampler` — sample this process's threads (no GIL visibility);
- `analyze(snapshots, method=..., duration_s=...)` — shares and blame from any snapshots;
  `merge_holders(report, held, ticks)` — exact holders from `py-spy record --gil` into it;
- `record.recorder_commands` / `record.read_recording` / `trace.report_of_recording` — the
  `record` sampler in pieces, for recorders started elsewhere (inside a sandbox, by the
  `gil_trace` tool, where py-spy can unwind the native stacks it cannot from outside).
`GilReport.render()`: the most-waiting thread, where it waits, and who held the GIL meanwhile
(and in which native frame, e.g. the regex engine), first; one row per thread name;
`GilReport.culprit()`: the thread (and its function and stack) to blame.
"""

from infra_agent.feedback.gil.analysis import analyze, classify
from infra_agent.feedback.gil.holders import HeldGil, merge_holders
from infra_agent.feedback.gil.inprocess import InProcessSampler
from infra_agent.feedback.gil.pyspy import PySpyUnavailable, dump_once, parse_dump, sample_pid
from infra_agent.feedback.gil.record import Recording, record_pid
from infra_agent.feedback.gil.report import (
    Culprit,
    Frame,
    GilReport,
    HolderEvidence,
    ThreadBlame,
    ThreadGil,
    ThreadSample,
)
from infra_agent.feedback.gil.trace import Sampler, trace_command, trace_pid

__all__ = [
    "Culprit",
    "Frame",
    "GilReport",
    "HeldGil",
    "HolderEvidence",
    "InProcessSampler",
    "PySpyUnavailable",
    "Recording",
    "Sampler",
    "ThreadBlame",
    "ThreadGil",
    "ThreadSample",
    "analyze",
    "classify",
    "dump_once",
    "merge_holders",
    "parse_dump",
    "record_pid",
    "sample_pid",
    "trace_command",
    "trace_pid",
]
