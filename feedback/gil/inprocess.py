"""In-process fallback: sample `sys._current_frames()` from a background thread.

It cannot see who holds the GIL (the sampler itself needs the GIL to look), so every sample has
`owns_gil=None` and the report says so; it still shows, per thread, where Python code is and
which threads are busy. A thread counts as idle when its innermost frame is a known blocking
call (sleep, wait, acquire, select, recv, ...).

    with InProcessSampler(interval_s=0.005) as sampler:
        run_workload()
    report = sampler.report()

`python -m infra_agent.feedback.gil.inprocess OUT.json DURATION_S script.py args...` runs a
script under the sampler and writes the snapshots to OUT.json after DURATION_S seconds (used by
`trace_command` when py-spy cannot attach).
"""

from __future__ import annotations

import json
import os
import re
import runpy
import sys
import threading
import time
from types import FrameType, TracebackType

from infra_agent.feedback.gil.analysis import analyze
from infra_agent.feedback.gil.report import Frame, GilReport, ThreadSample

BLOCKING = re.compile(
    r"^(sleep|wait|acquire|select|poll|recv|read|accept|get|join|_wait_for_tstate_lock)$"
)
METHOD = "in-process sys._current_frames() sampling (cannot see GIL ownership)"


def _frames(frame: FrameType | None, limit: int = 30) -> list[Frame]:
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append(Frame(name=code.co_name, file=code.co_filename, line=frame.f_lineno))
        frame = frame.f_back
    return out


def snapshot(exclude: set[int]) -> list[ThreadSample]:
    names = {t.ident: t.name for t in threading.enumerate()}
    samples = []
    for ident, frame in sys._current_frames().items():
        if ident in exclude:
            continue
        frames = _frames(frame)
        blocked = bool(frames) and bool(BLOCKING.match(frames[0].name))
        samples.append(
            ThreadSample(
                thread_id=ident,
                thread_name=names.get(ident, str(ident)),
                active=not blocked,
                owns_gil=None,
                frames=frames,
            )
        )
    return samples


class InProcessSampler:
    """Background sampler of this process's Python threads (see the module docstring)."""

    def __init__(self, interval_s: float = 0.005, max_snapshots: int = 20_000) -> None:
        self.interval_s = interval_s
        self.max_snapshots = max_snapshots
        self.snapshots: list[list[ThreadSample]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infra-agent-sampler", daemon=True)
        self._started = 0.0
        self.duration_s = 0.0

    def _run(self) -> None:
        me = {threading.get_ident()}
        while not self._stop.is_set() and len(self.snapshots) < self.max_snapshots:
            self.snapshots.append(snapshot(me))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> InProcessSampler:
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self.duration_s = time.perf_counter() - self._started

    def report(self) -> GilReport:
        return analyze(self.snapshots, method=METHOD, duration_s=self.duration_s, pid=os.getpid())


def main() -> int:
    out, duration_s, script, args = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
    sys.argv = [script, *args]
    sampler = InProcessSampler()

    def finish() -> None:
        time.sleep(duration_s)
        sampler.__exit__(None, None, None)
        data = [[s.model_dump() for s in snap] for snap in sampler.snapshots]
        tmp = out + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"duration_s": sampler.duration_s, "snapshots": data}, fh)
        os.replace(tmp, out)

    sampler.__enter__()
    threading.Thread(target=finish, name="infra-agent-sampler-writer", daemon=True).start()
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
