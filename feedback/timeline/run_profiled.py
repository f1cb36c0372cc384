"""`python -m infra_agent.feedback.timeline.run_profiled TRACE.json script.py args...`

Runs the script as `__main__` under torch.profiler and writes a Chrome trace to TRACE.json, and
its threads' names to TRACE.json.threads.json.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def main() -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    trace, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    sys.argv = [script, *args]
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    from infra_agent.feedback.timeline.profile import (
        all_threads_option,
        named_threads,
        thread_names_path,
    )

    with named_threads() as names, profile(activities=activities, **all_threads_option()) as prof:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    prof.export_chrome_trace(trace)
    thread_names_path(Path(trace)).write_text(json.dumps(names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
