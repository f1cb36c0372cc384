"""`microbench`: two expressions, each in its own sandboxed workspace process (the candidate's in a
patched copy when a patch is named), timed by the real bench engine (`feedback.bench.run_bench`:
warm-up, calibration, interleaved samples, adaptive stopping); speedup with a 95% CI. With no
setup or expressions: the experiment's own workload (the harness's `workload()`). With `captured`:
the calls a `capture` recorded on the live server, replayed in each arm (`tools.replay`). On a
serving task every arm imports the real SGLang package (its workspace copy's overlay)."""

from __future__ import annotations

import functools
from contextlib import ExitStack
from pathlib import Path
from typing import Literal

from pydantic import Field

from infra_agent.feedback.bench import BenchResult
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext
from infra_agent.tools.sandboxed import ArmParams, Arms, script

_BENCH_WORKER = """\
import sys, time
sys.path.insert(0, ".")
ns = {}
exec(compile(SETUP, "<setup>", "exec"), ns)
NOW = time.thread_time_ns if CLOCK == "cpu" else time.perf_counter_ns
f = eval(compile("lambda: (" + EXPR + ")", "<" + LABEL + ">", "eval"), ns)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    try:
        t0 = NOW()
        for _ in range(n):
            f()
        dt = NOW() - t0
    except Exception as exc:
        print("error " + (type(exc).__name__ + ": " + str(exc)).replace("\\n", " "), flush=True)
        continue
    print(repr(dt / 1e9 / n), flush=True)
"""
"""One arm inside its sandbox: the worker protocol of feedback.bench (timed here with
perf_counter_ns, or thread_time_ns for clock 'cpu'; the bench engine in the tool's process decides
iterations and stopping)."""


class Microbench(ArmParams):
    seconds: float = Field(3.0, ge=0.5, le=20.0, description="Measurement time budget.")
    clock: Literal["wall", "cpu"] = Field(
        "wall",
        description="'wall' (what run_experiment's harness clock sees) or 'cpu' (the arm's "
        "thread CPU time: far less noisy on a busy machine, for single-threaded CPU-bound code).",
    )
    captured: str | None = Field(
        None,
        description="A capture id (the capture tool's): time the captured calls of the real "
        "function, baseline vs candidate (patch_id); give no setup or expressions.",
    )


class MicrobenchRecord(BenchResult):
    """`feedback bench`'s BenchResult, plus the arms that ran and the task's minimum effect."""

    arms: Arms
    min_effect: float = 0.0
    """The task's `min_effect`: run_experiment counts a change only beyond it."""

    def render(self) -> str:
        text = f"microbench {self.arms.render()}\n{super().render()}"
        note = self.below_min_effect()
        return f"{text}\n{note}" if note else text

    def below_min_effect(self) -> str | None:
        """A FASTER or SLOWER smaller than the task's minimum effect, said plainly: two sandboxed
        processes running identical code differ by a few percent, and run_experiment would not
        count such a change (the minimum-effect rule of run_experiment's verdict)."""
        from infra_agent.judgement import beyond_min_effect

        c = self.comparison
        if self.min_effect <= 0 or c.verdict not in ("FASTER", "SLOWER"):
            return None
        if beyond_min_effect(c.speedup, c.ci_low, c.ci_high, self.min_effect) is not None:
            return None
        return (
            f"smaller than the task's minimum effect ({self.min_effect:.0%}): run_experiment "
            "would not count it, and two processes running identical code can differ this much"
        )


@instrument(
    "microbench",
    "Time two expressions interleaved (warm-up, calibration, adaptive stopping) in sandboxed "
    "workspace copies; speedup with 95% CI. With no inputs: on the experiment's own workload.",
    Microbench,
)
def microbench(p: Microbench, ctx: ToolContext) -> ToolResult:
    from infra_agent.feedback.bench import PipeTarget, run_bench
    from infra_agent.tools.replay import arm_box, replay_arms, serving_version

    version = serving_version(ctx)
    arms, patch, capture = replay_arms(p, ctx, version)
    timer = "sandbox:" + ("thread_time_ns" if p.clock == "cpu" else "perf_counter_ns")
    with ExitStack() as stack:
        procs = []
        for label, arm_patch in (("baseline", None), ("candidate", patch)):
            box, python, prelude = arm_box(ctx, arm_patch, version, capture)
            stack.callback(box.cleanup)
            code = arms.baseline if label == "baseline" else arms.candidate
            setup = prelude + arms.setup
            worker = script(_BENCH_WORKER, SETUP=setup, EXPR=code, LABEL=label, CLOCK=p.clock)
            box.write_file("_infra_agent_bench.py", worker.encode())
            procs.append((label, box.spawn([python, "_infra_agent_bench.py"])))
        targets = [  # both arms load (import SGLang: a minute on a busy machine) at once
            PipeTarget(
                proc.stdin,
                proc.stdout,
                name=f"the {label} arm",
                timer=timer,
                startup_timeout_s=600.0 if version else 120.0,
                describe_exit=functools.partial(_stderr_tail, proc.stderr_path),
            )
            for label, proc in procs
        ]
        result = run_bench(targets[0], targets[1], budget_s=p.seconds)
    return ToolResult.of(
        MicrobenchRecord(**dict(result), arms=arms, min_effect=ctx.task.manifest.min_effect)
    )


def _stderr_tail(path: Path | None, lines: int = 6) -> str:
    if path is None or not Path(path).is_file():
        return ""
    return "\n".join(Path(path).read_text(errors="replace").strip().splitlines()[-lines:])
