"""`profile`: a `torch.profiler` timeline of an expression called in a sandboxed workspace copy,
every thread's ops on a track named by the thread, summarized by `feedback.timeline`: time by op
class, the top ops, launch gaps, and overlaps between op groups."""

from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path

from pydantic import BaseModel, Field

from infra_agent.feedback.timeline import TimelineSummary
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext
from infra_agent.tools.sandboxed import (
    PRELUDE,
    RESULT_FILE,
    compile_check,
    run_script,
    script,
)

_PROFILE = (
    """\
import sys, threading
names = {}
def _name_thread(*args):  # a new thread's first call: note its name, stop being called
    names[threading.get_native_id()] = threading.current_thread().name
    sys.setprofile(None)
threading.setprofile(_name_thread)
"""
    + PRELUDE
    + """\
import torch
from torch.profiler import ProfilerActivity, profile
try:  # every thread, not only this one (torch >= 2.8)
    from torch._C._profiler import _ExperimentalConfig
    options = {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
except (ImportError, TypeError):
    options = {}
names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id})
f = eval(compile("lambda: (" + STMT + ")", "<code>", "eval"), ns)
f()
with profile(activities=[ProfilerActivity.CPU], **options) as prof:
    t0 = time.perf_counter()  # not the profiler's start and stop (seconds with all threads)
    for _ in range(REPEAT):
        f()
    wall = (time.perf_counter() - t0) / REPEAT
prof.export_chrome_trace(RESULT)
open(RESULT + ".wall", "w").write(str(wall))
open(RESULT + ".threads", "w").write(json.dumps({"all": bool(options), "names": names}))
"""
)


class Profile(BaseModel):
    setup: str = Field(
        description="Python run once first (imports from workspace modules, inputs)."
    )
    code: str = Field(description="Expression to profile, e.g. 'attention(q, k, v)'.")
    patch_id: str | None = Field(None, description="Apply this patch to the workspace copy first.")
    repeat: int = Field(5, ge=1, le=100)
    overlaps: list[tuple[str, str]] = Field(
        default_factory=list,
        description="Pairs of op-name regexes [A, B]: how much of A's time overlaps B.",
    )


class ProfileRecord(BaseModel):
    """The wall time of one call and the timeline summary of `repeat` calls."""

    wall_ms: float
    """Wall time per call while profiled, ms."""
    summary: TimelineSummary

    def render(self) -> str:
        return f"wall time per call {self.wall_ms:.3f} ms\n{self.summary.render()}"


@instrument(
    "profile",
    "Profile an expression (torch.profiler timeline of every thread, by name): time by op "
    "class, top ops, gaps, overlaps.",
    Profile,
)
def profile(p: Profile, ctx: ToolContext) -> ToolResult:
    from infra_agent.feedback.timeline import load_trace, summarize

    compile_check(p.setup, "exec", "setup")
    compile_check(p.code, "eval", "code")
    from infra_agent.tools.replay import arm_box, serving_version

    # On a serving task the script runs as a replay does: SGLang's interpreter, the real package
    # (with the patch's overlay) importable; a relay run's setup failed on 'import sglang'.
    version = serving_version(ctx)
    box, python, prelude = arm_box(ctx, ctx.patch(p.patch_id) if p.patch_id else None, version, None)  # fmt: skip
    code = script(_PROFILE, SETUP=prelude + textwrap.dedent(p.setup), STMT=p.code, REPEAT=p.repeat)
    extra = [RESULT_FILE + ".wall", RESULT_FILE + ".threads"]
    with box:
        trace, wall, meta = run_script(box, code, 600 if version else 120, extra, python=python)
    threads = json.loads(meta)
    names = {int(tid): name for tid, name in threads["names"].items()}
    with tempfile.TemporaryDirectory(prefix="infra-agent-trace-") as tmp:
        path = Path(tmp) / "trace.json"
        path.write_bytes(trace)
        summary = summarize(
            load_trace(path, thread_names=names), overlaps=p.overlaps,
            source="torch.profiler (sandbox)",
        )  # fmt: skip
    if not threads["all"]:
        summary.warnings.append("this torch records only the thread that called the code")
    return ToolResult.of(ProfileRecord(wall_ms=float(wall) * 1e3, summary=summary))
