"""`accuracy_diff`: two (or three, with a float64 reference) expressions evaluated in sandboxed
workspace copies to tensors or dicts of named tensors; `feedback.accuracy.compare_paths` finds
where they part ways and says whether the candidate would pass the experiment's accuracy rule.
With no setup or expressions: the experiment's own workload and its float64 reference. With
`captured`: the calls a `capture` recorded on the live server, replayed in each arm (`tools.replay`),
their outputs (and tensor arguments after the call) compared. On a serving task every arm imports
the real SGLang package (its workspace copy's overlay)."""

from __future__ import annotations

import functools
import io
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pydantic import Field

from infra_agent.errors import UserError
from infra_agent.tasks.workload import Workload
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext
from infra_agent.tools.sandboxed import (
    PRELUDE,
    ArmParams,
    Arms,
    resolve_arms,
    run_script,
    script,
)

if TYPE_CHECKING:
    from infra_agent.feedback.accuracy import AccuracyReport, ToleranceRule
    from infra_agent.tasks.patch import Patch

_ACCURACY = (
    PRELUDE
    + """\
import torch
def named(value, label):
    if isinstance(value, torch.Tensor):
        return {"output": value.detach().cpu()}
    if isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()):
        return {str(k): v.detach().cpu() for k, v in value.items()}
    raise TypeError(label + " must evaluate to a tensor or a dict of tensors, got " + type(value).__name__)
out = {label: named(eval(code, ns), label) for label, code in EXPRS.items()}
torch.save(out, RESULT)
"""
)


class AccuracyDiff(ArmParams):
    reference: str | None = Field(
        None,
        description="Optional float64 reference expression. Default with the experiment's call: "
        "the workload's float64 reference.",
    )
    captured: str | None = Field(
        None,
        description="A capture id (the capture tool's): run the captured calls of the real "
        "function in the baseline and the candidate (patch_id) and compare every output; give no "
        "setup or expressions.",
    )


@functools.cache
def record_type() -> type[AccuracyReport]:
    """The typed record: `feedback accuracy`'s AccuracyReport (rule, would_pass, probes...), plus
    the arms. Built on first use: the accuracy engine imports torch, which listing the tools
    should not."""
    from infra_agent.feedback.accuracy import AccuracyReport

    class AccuracyDiffRecord(AccuracyReport):
        arms: Arms

        def render(self, max_probes: int = 8) -> str:
            head = f"accuracy_diff {self.arms.render()}"
            if self.arms.captured:  # a replay: the decisive number over all calls first
                worst = max((p.diff.max_abs for p in self.probes), default=0.0)
                calls = len({p.name.split(".", 1)[0] for p in self.probes})
                head += (
                    f": max abs err {worst:.3g} over {calls} calls ({len(self.probes)} tensors: "
                    "outputs, and arguments after each call)"
                )
                if self.would_pass:  # all within tolerance: a few tensors show it
                    max_probes = min(max_probes, 3)
            return f"{head}\n{super().render(max_probes)}"

    return AccuracyDiffRecord


@instrument(
    "accuracy_diff",
    "Compare two execution paths' tensors (each expression gives a tensor or a dict of named "
    "tensors; optionally a float64 reference) as relative RMS and max error, against the "
    "experiment's accuracy rule (would pass/fail). With no inputs: on the experiment's own "
    "workload.",
    AccuracyDiff,
)
def accuracy_diff(p: AccuracyDiff, ctx: ToolContext) -> ToolResult:
    from infra_agent.tools.replay import serving_version

    version = serving_version(ctx)
    if p.captured:
        return _replay(p, ctx, version)
    return _expressions(p, ctx, version)


def _expressions(p: AccuracyDiff, ctx: ToolContext, version: str | None) -> ToolResult:
    import torch

    from infra_agent.feedback.accuracy import compare_paths
    from infra_agent.tools.replay import arm_box

    arms, patch = resolve_arms(
        ctx, p.setup, p.baseline, p.candidate, p.patch_id, p.reference, want_reference=True
    )
    exprs = {"baseline": arms.baseline, "candidate": arms.candidate}
    if arms.reference:
        exprs["reference"] = arms.reference
    runs: list[tuple[dict[str, str], Patch | None]] = [(exprs, None)]
    if patch is not None:  # the baseline (and reference) unpatched, the candidate patched
        runs = [({k: v for k, v in exprs.items() if k != "candidate"}, None),
                ({"candidate": arms.candidate}, patch)]  # fmt: skip
    tensors: dict[str, dict[str, torch.Tensor]] = {}
    for wanted, arm_patch in runs:
        box, python, prelude = arm_box(ctx, arm_patch, version, None)
        with box:
            code = script(_ACCURACY, SETUP=prelude + arms.setup, EXPRS=wanted)
            out = run_script(box, code, 600 if version else 120, python=python)
        tensors.update(torch.load(io.BytesIO(out), weights_only=True))  # tensors only
    rule = _rule(ctx, arms.workload, tensors["baseline"])
    report = compare_paths(
        tensors["baseline"], tensors["candidate"], reference=tensors.get("reference"), rule=rule
    )
    return ToolResult.of(record_type().model_validate({**dict(report), "arms": arms}))


def _replay(p: AccuracyDiff, ctx: ToolContext, version: str | None) -> ToolResult:
    """The captured calls run in the baseline and in the candidate; every output compared
    against the dtype's assert_close tolerance (no task rule is about one function)."""
    import torch

    from infra_agent.feedback.accuracy import ToleranceRule, compare_paths, default_tolerance
    from infra_agent.tools.replay import REPLAY_OUTPUTS, arm_box, replay_arms

    if p.reference:
        raise UserError("captured replays compare baseline and candidate; give no reference")
    arms, patch, capture = replay_arms(p, ctx, version)
    assert capture is not None

    def run(arm_patch: Patch | None) -> dict[str, torch.Tensor]:
        box, python, prelude = arm_box(ctx, arm_patch, version, capture)
        with box:
            out = run_script(box, script(prelude + REPLAY_OUTPUTS), 600, python=python)
        return dict(torch.load(io.BytesIO(out), weights_only=True))  # tensors only

    with ThreadPoolExecutor(2) as pool:  # both arms import SGLang (a minute when busy) at once
        done = [pool.submit(run, arm_patch) for arm_patch in (None, patch)]
        tensors = {"baseline": done[0].result(), "candidate": done[1].result()}
    rtol, atol = default_tolerance(*{t.dtype for t in tensors["baseline"].values()})
    rule = ToleranceRule(
        atol=atol, rtol=rtol, source="torch.testing.assert_close defaults for the outputs' dtype"
    )
    report = compare_paths(tensors["baseline"], tensors["candidate"], rule=rule)
    return ToolResult.of(record_type().model_validate({**dict(report), "arms": arms}))


def _rule(ctx: ToolContext, workload: Workload | None, baseline: dict[str, Any]) -> ToleranceRule:
    """The accuracy rule run_experiment applies on this task: the harness's element-wise
    tolerance (from its workload) and the task's float64 rule (f64_factor, f64_floor)."""
    from infra_agent.feedback.accuracy import ToleranceRule, default_tolerance

    if workload is None:
        from infra_agent.tools.workload import task_workload

        workload = task_workload(ctx)
    tol = ctx.task.manifest.tolerance
    atol, rtol = workload.atol, workload.rtol
    if (atol is None) != (rtol is None):  # one given: the other is the dtype's default
        d_rtol, d_atol = default_tolerance(*{t.dtype for t in baseline.values()})
        atol = d_atol if atol is None else atol
        rtol = d_rtol if rtol is None else rtol
    return ToleranceRule(
        atol=atol,
        rtol=rtol,
        f64_factor=tol.f64_factor,
        f64_floor=tol.f64_floor,
        f64_error=workload.f64_error,
        source=f"task {ctx.task.name}'s tolerance",
    )
