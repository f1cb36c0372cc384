"""What the sandboxed instruments share: a workspace copy to run the model's code in, the script
that runs there, and the two arms (baseline and candidate) filled from the experiment's workload.

The model's code (setup and expressions) runs against a private, network-less copy of the
workspace (optionally with one of its patches applied), in the same sandbox the experiments use,
with the harness and this package hidden; the raw numbers come back to this process, where an
instrument of `feedback/` turns them into a verdict and a short text.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.tasks.workload import Workload
from infra_agent.tools.context import ToolContext

if TYPE_CHECKING:
    from infra_agent.sandboxes.base import Sandbox
    from infra_agent.tasks.patch import Patch

RESULT_FILE = ".infra_agent_instrument.out"
SCRIPT_FILE = "_infra_agent_instrument.py"

PRELUDE = """\
import json, sys, time
sys.path.insert(0, ".")
ns = {}
exec(compile(SETUP, "<setup>", "exec"), ns)
"""
"""The start of every instrument script: the workspace importable, the setup run into `ns`."""


def script(template: str, **values: Any) -> str:
    """`template` with each value bound to a global of its name (as JSON) and RESULT set."""
    header = "".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items())
    return header + f"RESULT = {json.dumps(RESULT_FILE)}\n" + template


def compile_check(code: str, mode: str, what: str) -> None:
    """Raise a UserError naming `what` when `code` is not valid Python (mode 'exec'/'eval')."""
    try:
        compile(code, f"<{what}>", mode)
    except SyntaxError as exc:
        raise UserError(f"{what} is not valid Python ({exc.msg}, line {exc.lineno})") from exc


def open_sandbox(
    ctx: ToolContext, patch: Patch | None, readonly: list[Path] | None = None,
    *, resident_only: bool = False,
) -> Sandbox:  # fmt: skip
    """A sandboxed copy of the workspace (with `patch` applied; `readonly`: host folders it also
    sees, e.g. the SGLang environment a replay imports; `resident_only`: the memory limit on
    resident memory alone, not the address space); the caller cleans it up."""
    from infra_agent.experiments.arms import sandbox_spec
    from infra_agent.sandboxes import create_sandbox
    from infra_agent.tasks.patch import apply_patch
    from infra_agent.tasks.tree import workspace_folder

    spec = sandbox_spec(ctx.task)
    spec.readonly_paths += readonly or []
    spec.limit_address_space = not resident_only
    with workspace_folder(ctx.task, patch.files if patch else ()) as folder:
        box = create_sandbox(ctx.sandbox, folder, spec)
    try:
        if patch is not None:
            apply_patch(patch, ctx.task, box.root)
    except BaseException:
        box.cleanup()
        raise
    return box


def run_script(
    box: Sandbox, code: str, timeout_s: float, extra: list[str] | None = None,
    python: str = sys.executable,
) -> Any:  # fmt: skip
    """Run the script `code` in `box` (under `python`: SGLang's for a replay); return its result
    file's bytes (a tuple with the `extra` files' bytes when asked). Raises UserError with the
    script's error when it fails."""
    box.write_file(SCRIPT_FILE, code.encode())
    result = box.exec([python, SCRIPT_FILE], timeout_s=timeout_s)
    if result.timed_out:
        raise UserError(f"the instrument script ran past {timeout_s:.0f} s and was killed")
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-6:])
        raise UserError(f"the instrument script failed (exit {result.returncode}):\n{tail}")
    if extra:
        return (box.read_file(RESULT_FILE), *(box.read_file(name) for name in extra))
    return box.read_file(RESULT_FILE)


class ArmParams(BaseModel):
    """The parameters of a two-arm instrument (microbench, accuracy_diff): what the model leaves
    out comes from the experiment's own workload (`resolve_arms`)."""

    setup: str | None = Field(
        None,
        description="Python run once first (imports from workspace modules, inputs). "
        "Default: the experiment's own workload setup (see describe_task).",
    )
    baseline: str | None = Field(
        None,
        description="The baseline's expression, e.g. 'f(x)'. Default: the call the experiment "
        "measures.",
    )
    candidate: str | None = Field(
        None,
        description="The candidate's expression (the other path). Default: the baseline "
        "expression (with patch_id: in the patched copy, with the patch's knobs).",
    )
    patch_id: str | None = Field(
        None,
        description="Run the candidate in a workspace copy with this patch applied (the "
        "baseline never is).",
    )


class Arms(BaseModel):
    """What a two-arm instrument ran: the code of each arm and where it ran."""

    setup: str
    baseline: str
    candidate: str
    reference: str | None = None
    patch_id: str | None = None
    """The candidate ran in a workspace copy with this patch (the baseline never does)."""
    workload: Workload | None = None
    """The experiment's workload, when the setup or an expression came from it."""
    captured: str | None = None
    """A replay of captured calls (`tools.replay`): the function, calls and shapes, in words."""

    def render(self) -> str:
        where = f"candidate with patch {self.patch_id[:12]}" if self.patch_id else "no patch"
        if self.captured:
            return (
                f"{self.captured}: baseline vs candidate ({where}); a call here runs every "
                "captured call once"
            )
        text = (
            f"baseline `{_short(self.baseline)}` vs candidate `{_short(self.candidate)}` ({where})"
        )
        if self.workload is not None:
            text = f"on the experiment's workload (describe_task shows it): {text}"
        return text


def _short(code: str, limit: int = 100) -> str:
    code = " ".join(code.split())
    return code if len(code) <= limit else code[: limit - 3] + "..."


def resolve_arms(
    ctx: ToolContext,
    setup: str | None,
    baseline: str | None,
    candidate: str | None,
    patch_id: str | None,
    reference: str | None = None,
    *,
    want_reference: bool = False,
) -> tuple[Arms, Patch | None]:
    """Fill what the model left out from the experiment's workload (tasks.workload): the setup,
    the measured call for the baseline (task knobs) and for the candidate (the patch's knobs),
    and the float64 reference. Checks every piece of code compiles."""
    patch = ctx.patch(patch_id) if patch_id else None
    workload = None
    if setup is None or baseline is None:
        from infra_agent.tools.workload import task_workload

        published = task_workload(ctx)
        if not published.ready:
            raise UserError(
                f"task {ctx.task.name} publishes no ready setup for its workload; give setup, "
                "baseline and candidate"
            )
        workload = published
        if baseline is None:
            if candidate is None:  # the measured call with the knobs the patch's arm would run
                candidate = task_workload(ctx, patch).call if patch else published.call
            if want_reference and reference is None and published.reference:
                reference = published.reference
            baseline = published.call
        setup = published.setup if setup is None else setup
    candidate = baseline if candidate is None else candidate
    arms = Arms(
        setup=textwrap.dedent(setup),
        baseline=baseline,
        candidate=candidate,
        reference=reference,
        patch_id=patch_id,
        workload=workload,
    )
    compile_check(arms.setup, "exec", "setup")
    for what, code in (("baseline", baseline), ("candidate", candidate), ("reference", reference)):
        if code:
            compile_check(code, "eval", what)
    return arms, patch
