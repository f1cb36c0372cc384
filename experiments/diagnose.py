"""Reproduce a task's symptom and localize it, changing no code (`infra-agent diagnose --task T`;
the records and the generic diagnosis are in `tasks.diagnose`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from infra_agent.experiments.arms import (
    arm_set,
    effective_params,
    load_harness,
    sandbox_spec,
)
from infra_agent.sandboxes import create_sandbox, ensure_backend
from infra_agent.tasks.diagnose import Diagnosis, generic_diagnosis
from infra_agent.tasks.patch import effective_knobs
from infra_agent.tasks.registry import find_task
from infra_agent.tasks.tree import workspace_folder


def run_diagnosis(
    task_name: str,
    params: dict[str, Any] | None = None,
    *,
    sandbox: str = "local",
    search_path: Iterable[Path] = (),
) -> Diagnosis:
    """Reproduce and localize `task_name`'s symptom on its unmodified workspace (a task name is
    looked up in `search_path` too: the configured `settings.tasks.search_path`)."""
    task = find_task(task_name, search_path)
    manifest = task.manifest
    ensure_backend(sandbox)  # docker: starts a private engine when none answers
    resolved = effective_params(manifest, params)
    started = time.monotonic()
    harness = load_harness(task, resolved)
    arms = arm_set(task)
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
