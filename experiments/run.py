"""One experiment as asked for: the request checked, the patch refused or run through the
cascade (`experiments/cascade.py`), the record returned and stored.

    record = run_experiment(task, patch, sandbox="local", store=store)

A bad request raises UserError before anything runs or is recorded; a refused patch is an
experiment too (REJECTED at the apply stage). The record carries the task's fingerprint, so a
later reader can tell whether the task changed since.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from infra_agent.errors import UserError
from infra_agent.experiments.arms import effective_params, patch_refusal
from infra_agent.experiments.cascade import Experiment, Progress
from infra_agent.experiments.extend import Prior, extension_refusal, same_arms_refusal
from infra_agent.store.base import RunStore
from infra_agent.store.records import ExperimentRecord, now
from infra_agent.store.verdict import Evidence, ExperimentResult, Verdict
from infra_agent.tasks.checked import CheckedPatch, check_patch, checked
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import DEFAULT_MAX_PATCH_BYTES, Patch
from infra_agent.tasks.tree import workspace_tree


def task_fingerprint(task: Task) -> str:
    """sha256 of the manifest, harness, deployment and the baseline workspace (the task folder's
    files, or an installed package's identity with the injected fault): a staleness check."""
    digest = hashlib.sha256()
    files = [task.root / "task.toml", task.harness_path, task.root / "deployment.toml"]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(task.root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    digest.update(workspace_tree(task).fingerprint().encode())
    return digest.hexdigest()


def run_experiment(
    task: Task,
    patch: Patch | CheckedPatch,
    *,
    sandbox: str = "local",
    params: dict[str, Any] | None = None,
    store: RunStore | None = None,
    run_id: str | None = None,
    progress: Progress | None = None,
    seed: int | None = None,
    detect: float | None = None,
    extend: ExperimentRecord | None = None,
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES,
) -> ExperimentRecord:
    """Run one experiment and return its record (also stored when `store` is given).

    A bad invocation (unknown parameter or backend, a `detect` outside (min_effect, 10) or for a
    rate metric) raises UserError before anything runs or is recorded. A patch this task refuses
    (it does not apply, is too large, targets a missing or non-editable file, sets an unknown knob
    or a bad value) is an experiment too: REJECTED at the apply stage, recorded with its reason.
    `seed` only fixes the statistics' bootstrap; input seeds always come from os.urandom.
    `detect` asks for a finer resolution than the task's (0.05: see a 5% change); the verdict
    says when the budget could not reach it. `extend` continues an unresolved NO_CHANGE of
    the same patch on the same arms (experiments/extend.py: its pairs first, then at most the
    task's max_samples more, at its resolution); any other is a UserError saying why.
    `max_patch_bytes`: the configured `sandbox.max_patch_bytes` (a larger diff is REJECTED).
    A checked patch (tasks.checked, as the agent's tools build it) is not checked again; a plain
    one is checked here, once, and its check read by every stage."""
    from infra_agent.sandboxes import create_sandbox, ensure_backend

    _check_detect(task, detect)
    if isinstance(patch, CheckedPatch):
        patch, found = patch.patch, checked(patch, task)
    else:
        found = None
    resolved = effective_params(task.manifest, params)
    prior = None
    if extend is not None:
        prior = _prior(task, patch, extend, detect=detect, params=resolved, sandbox=sandbox)
    ensure_backend(sandbox)  # docker: starts a private engine when none answers
    started_at, t0 = now(), time.monotonic()
    found = found or check_patch(patch, task)
    refused = patch_refusal(found, task, max_patch_bytes)
    if refused is not None:
        result = ExperimentResult(
            task=task.name, patch_id=patch.hash, verdict=Verdict.REJECTED,
            reasons=[f"patch refused: {refused}"],
            evidence=Evidence(stage_reached="apply", rule_violations=[refused], params=resolved),
        )  # fmt: skip
    else:
        experiment = Experiment(
            task, found, backend=sandbox, params=resolved, progress=progress,
            bootstrap_seed=seed if seed is not None else 0, detect=detect, prior=prior,
        )  # fmt: skip
        result = experiment.run(create_sandbox)
    record = ExperimentRecord(
        run_id=run_id,
        task=task.name,
        patch_id=patch.hash,
        sandbox=sandbox,
        result=result,
        started_at=started_at,
        duration_s=round(time.monotonic() - t0, 3),
        target_fingerprint=task_fingerprint(task),
    )
    result.evidence.durations_s["total"] = record.duration_s
    if store is not None:
        with store.transaction():
            store.put_patch(patch.to_record())
            store.put_experiment(record)
    return record


def _check_detect(task: Task, detect: float | None) -> None:
    """UserError unless `detect` is None or a finer resolution this task's metric can use."""
    if detect is None:
        return
    if not 0.0 < detect < 10.0:
        raise UserError(f"detect must be a relative change in (0, 10), e.g. 0.05; got {detect}")
    if task.manifest.metric.events is not None:
        raise UserError(
            f"detect applies to a speedup; task '{task.name}' has a rate metric, sampled until "
            "the difference is shown (its target and budget set the precision)"
        )
    if detect <= task.manifest.min_effect:
        raise UserError(
            f"detect {detect:g} is not above the task's min_effect {task.manifest.min_effect:g}: "
            "a change that small is NO_CHANGE by the task's rule, whatever the budget"
        )


def _prior(
    task: Task, patch: Patch, extend: ExperimentRecord, *, detect: float | None,
    params: dict[str, Any], sandbox: str,
) -> Prior:  # fmt: skip
    """The earlier experiment `extend` continues, or UserError saying why it cannot."""
    if detect is not None:
        raise UserError("an extension keeps the earlier experiment's resolution; drop detect")
    why = extension_refusal(extend) or same_arms_refusal(
        extend, task=task.name, fingerprint=task_fingerprint(task), patch_id=patch.hash,
        params=params, sandbox=sandbox,
    )  # fmt: skip
    if why is not None:
        raise UserError(f"not extended: {why}")
    return Prior.of(extend)


__all__ = ["run_experiment", "task_fingerprint"]
