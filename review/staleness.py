"""Whether a proposal's evidence still stands: the patch stored now is the patch measured, every
experiment behind it measured that patch, and the target's fingerprint has not changed since.

    staleness(store, proposal)   # None, or why an approval must wait for a re-verification
"""

from __future__ import annotations

from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.experiments import task_fingerprint
from infra_agent.store.base import RunStore
from infra_agent.store.records import ProposalRecord
from infra_agent.tasks.manifest import Task, load_task
from infra_agent.tasks.patch import Patch
from infra_agent.tasks.registry import find_task


def resolve_task(proposal: ProposalRecord) -> Task | None:
    """The task a proposal was measured on: its recorded folder, else by name; None if gone."""
    if proposal.task_root and Path(proposal.task_root, "task.toml").is_file():
        return load_task(Path(proposal.task_root))
    try:
        return find_task(proposal.task)
    except UserError:
        return None


def stored_patch(store: RunStore, proposal: ProposalRecord) -> Patch:
    """The proposal's patch as stored now (UserError if it is missing); compare its `hash`, not
    the row's id, with `proposal.patch_hash`."""
    record = store.get_patch(proposal.patch_id)
    if record is None:
        raise UserError(
            f"patch {proposal.patch_id[:12]} of {proposal.id} is missing from the run store"
        )
    return Patch.from_record(record)


def changed_patch(proposal: ProposalRecord, patch: Patch) -> str | None:
    """Why `patch` is not the patch the proposal's evidence was measured on, or None."""
    if patch.hash == proposal.patch_hash:
        return None
    return (
        f"the stored patch's bytes hash to {patch.hash[:12]}, not to the measured "
        f"{proposal.patch_hash[:12]}: it was changed after it was verified"
    )


def staleness(store: RunStore, proposal: ProposalRecord, task: Task | None = None) -> str | None:
    """Why the proposal's evidence cannot support an approval now, or None if it is current."""
    if not proposal.experiment_ids:
        return "no experiment backs this proposal; re-verify it"
    try:
        changed = changed_patch(proposal, stored_patch(store, proposal))
    except UserError as exc:
        return f"{exc}; re-verify it"
    if changed is not None:
        return f"{changed}; re-verify it"
    for exp_id in proposal.experiment_ids:
        exp = store.get_experiment(exp_id)
        if exp is None:
            return f"experiment {exp_id} is missing from the run store; re-verify"
        if exp.patch_id != proposal.patch_hash:
            return (
                f"evidence was measured on patch {exp.patch_id[:12]}, but the proposal carries "
                f"{proposal.patch_hash[:12]}; re-verify"
            )
    task = task or resolve_task(proposal)
    if task is None:
        return f"task '{proposal.task}' cannot be found, so the target cannot be checked; re-verify"
    now_fp = task_fingerprint(task)
    if proposal.target_fingerprint and now_fp != proposal.target_fingerprint:
        return (
            f"the target changed since the experiment (task fingerprint "
            f"{proposal.target_fingerprint[:12]} -> {now_fp[:12]}); re-verify"
        )
    return None
