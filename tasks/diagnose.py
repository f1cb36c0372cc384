"""`infra-agent diagnose --task T`: reproduce a task's symptom and localize it, changing no code.

The "reproduce -> localize" half of the method, usable on its own. The task's baseline workspace
runs in a sandbox with an RPC worker exactly as in an experiment; the task's harness (trusted)
reproduces the symptom with fixed seeds and applies the instruments that fit it:

- accuracy tasks: `feedback.accuracy.compare_paths` stage by stage against float64 or between
  batch shapes (the first divergence names the stage), and the error's growth with size;
- GIL tasks: `feedback.gil` samples the worker's threads (who holds the GIL, who waits, where);
- correctness-under-load tasks: a seeded stress run whose every output the harness checks, and
  `feedback.timeline` overlap where the fix must keep it;
- serving tasks (a live SGLang server): profiles of the server's processes under the workload,
  GIL traces, accuracy probes and outputs under load against the same requests alone
  (`serving/diagnosis.py`).

A harness opts in with a method `diagnose(self, arm) -> Diagnosis`; tasks without one get the
generic diagnosis (correctness check and a few samples of the metric).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import typer
from pydantic import BaseModel, Field

from infra_agent.errors import UserError

DIAGNOSIS_SCHEMA_VERSION = 1
DIAGNOSE_SEED = 20260
"""Fixed seed: a diagnosis reproduces the same inputs every time."""


class Localization(BaseModel):
    """Where the instruments put the problem (any of the three may be unknown)."""

    stage: str | None = None
    """Computation stage, e.g. 'state_merge' or 'combine'."""
    thread: str | None = None
    """Thread name, e.g. 'MainThread'."""
    function: str | None = None
    """Function as 'file:function', e.g. 'dispatch.py:intranode_dispatch'."""
    detail: str = ""
    """One sentence: what happens there."""


class Diagnosis(BaseModel):
    """What `infra-agent diagnose` found: the symptom with its size, where it is, and why."""

    schema_version: int = DIAGNOSIS_SCHEMA_VERSION
    task: str = ""
    objective: str = ""
    reproduced: bool
    """Whether the symptom showed up in this run."""
    symptom: str
    """One line with the measured rate or size."""
    measured: dict[str, float] = Field(default_factory=dict)
    """The symptom's numbers, name -> value (units in the name)."""
    localization: Localization = Field(default_factory=Localization)
    divergence_point: str | None = None
    """Accuracy tasks: the first stage out of tolerance, in execution order."""
    blocking_stack: list[str] = Field(default_factory=list)
    """GIL tasks: the holder's stack, innermost frame first."""
    evidence: list[str] = Field(default_factory=list)
    """Lines with the numbers behind the localization (per-stage errors, sample shares...)."""
    instruments: list[str] = Field(default_factory=list)
    """Instruments used, e.g. ['accuracy.compare_paths', 'accuracy.error_sweep']."""
    params: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0

    def render(self) -> str:
        """Short text for a person or a model: the decisive numbers first."""
        head = "REPRODUCED" if self.reproduced else "NOT REPRODUCED"
        lines = [f"{head} {self.task}: {self.symptom}"]
        loc = self.localization
        where = [
            f"{k} {v}"
            for k, v in (("stage", loc.stage), ("thread", loc.thread), ("function", loc.function))
            if v
        ]
        if where:
            lines.append(
                "localized to " + ", ".join(where) + (f": {loc.detail}" if loc.detail else "")
            )
        if self.divergence_point:
            lines.append(f"first divergence: {self.divergence_point}")
        if self.blocking_stack:
            lines.append("blocking stack: " + " <- ".join(self.blocking_stack[:6]))
        lines.extend(f"- {e}" for e in self.evidence[:12])
        if self.instruments:
            lines.append(f"instruments: {', '.join(self.instruments)} ({self.duration_s:.1f} s)")
        return "\n".join(lines)


def generic_diagnosis(harness: Any, arm: Any, samples: int = 3) -> Diagnosis:
    """For harnesses without `diagnose`: one correctness check and a few metric samples."""
    manifest = harness.manifest
    check = harness.check(arm, DIAGNOSE_SEED)
    values = [harness.sample(arm, DIAGNOSE_SEED + 1 + i) for i in range(samples)]
    metric = manifest.metric.name
    median = statistics.median(v[metric] for v in values)
    return Diagnosis(
        reproduced=not check.passed,
        symptom=f"{metric} median {median:.4g} {manifest.metric.unit} over {samples} samples; "
        f"correctness {'pass' if check.passed else 'FAIL: ' + str(check.detail)}",
        measured={metric: median},
        evidence=[f"sample {i}: {v}" for i, v in enumerate(values)],
        instruments=["harness.check", "harness.sample"],
    )


def run_diagnosis(
    task_name: str, params: dict[str, Any] | None = None, *, sandbox: str = "local"
) -> Diagnosis:
    """Reproduce and localize `task_name`'s symptom on its unmodified workspace."""
    from infra_agent.experiments.arms import (
        ArmSet,
        effective_params,
        load_harness,
        preload_modules,
        sandbox_spec,
        worker_guard,
    )
    from infra_agent.sandboxes import available_backends, create_sandbox
    from infra_agent.tasks.patch import effective_knobs
    from infra_agent.tasks.registry import find_task
    from infra_agent.tasks.tree import workspace_folder

    task = find_task(task_name)
    manifest = task.manifest
    problem = available_backends().get(sandbox, "unknown backend")
    if problem is not None:
        raise UserError(f"sandbox backend '{sandbox}' cannot be used here: {problem}")
    resolved = effective_params(manifest, params)
    started = time.monotonic()
    harness = load_harness(task, resolved)
    arms = ArmSet(manifest.budget.call_timeout_s, preload_modules(task), worker_guard(task))
    arm = None
    try:
        with workspace_folder(task) as folder:
            box = create_sandbox(sandbox, folder, sandbox_spec(task))
        arm = arms.open("baseline", box, effective_knobs(None, manifest), resolved)
        harness.prepare(arm)
        hook = getattr(harness, "diagnose", None)
        result = hook(arm) if callable(hook) else generic_diagnosis(harness, arm)
    finally:
        if arm is not None:
            try:
                harness.finish(arm)
            except Exception:  # noqa: BLE001 - cleanup must not mask the diagnosis's error
                pass
        arms.close()
    result.task = task.name
    result.objective = manifest.objective
    result.params = resolved
    result.duration_s = round(time.monotonic() - started, 2)
    return result


def _parse_params(items: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UserError(f"--param expects NAME=VALUE, got {item!r}")
        params[name.strip()] = value.strip()
    return params


def register(app: typer.Typer) -> None:
    @app.command()
    def diagnose(
        task: str = typer.Option(..., "--task", help="Task name or folder."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
        param: list[str] = typer.Option(
            [], "--param", help="Scale parameter NAME=VALUE (repeatable)."
        ),
        sandbox: str = typer.Option("local", "--sandbox", help="Sandbox backend: local|docker."),
    ) -> None:
        """Reproduce a task's symptom and localize it with the instruments, changing no code."""
        from infra_agent.output import emit, status_console

        params = _parse_params(param)
        status_console(as_json).print(f"diagnosing {task} (reproduce, then localize)...")
        result = run_diagnosis(task, params, sandbox=sandbox)
        emit(result, lambda console: console.print(result.render(), markup=False), as_json=as_json)
