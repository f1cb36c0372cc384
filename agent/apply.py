"""Apply an approved proposal: the patched workspace and its knobs, written where a person can use them.

The task's own folder is never modified (it may be the installed package). The result goes to
`<store dir>/applied/<run id>/<proposal id>/` (or `apply_to`): `workspace/` with the patch applied,
`knobs.toml` with the effective knob values, and `patch.diff` when the patch is a diff. The
proposal becomes `applied`, with an audit entry.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.store import RunStore
from infra_agent.store.records import DecisionAction, DecisionRecord, ProposalStatus
from infra_agent.tasks.manifest import Task

APPLIER = "infra-agent"
"""Reviewer name on the audit entry of an application (the reviewer's approval precedes it)."""


def _store_dir(store: RunStore) -> Path:
    path = getattr(store, "path", None)
    return Path(path).parent if path is not None else Path.cwd()


def apply_proposal(
    store: RunStore, proposal_id: str, task: Task, *, run_id: str, apply_to: str | None = None
) -> str:
    """Apply an approved proposal's patch; return where it was written (idempotent)."""
    from infra_agent.tasks.patch import Patch, apply_patch

    proposal = store.get_proposal(proposal_id)
    if proposal is None:
        raise UserError(f"proposal '{proposal_id}' not found")
    dest = Path(apply_to) if apply_to else _store_dir(store) / "applied" / run_id / proposal_id
    if proposal.status == ProposalStatus.APPLIED:
        return str(dest)
    if proposal.status != ProposalStatus.APPROVED:
        raise UserError(f"proposal {proposal_id} is {proposal.status.value}, not approved")
    record = store.get_patch(proposal.patch_id)
    if record is None:
        raise UserError(
            f"proposal {proposal_id}: its patch {proposal.patch_id[:12]} is not in the store"
        )
    patch = Patch(
        kind=record.kind.value,
        diff=record.diff,
        knobs=record.knobs,
        author=record.author,
        rationale=record.rationale,
    )
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copytree(task.workspace, dest / "workspace", symlinks=True)
    knobs = apply_patch(patch, task, dest / "workspace")
    lines = [f"{k} = {json.dumps(v)}" for k, v in sorted(knobs.items()) if v is not None]
    (dest / "knobs.toml").write_text("\n".join(lines) + ("\n" if lines else ""))
    if patch.kind == "diff":
        (dest / "patch.diff").write_text(patch.diff)
    with store.transaction():
        if store.set_proposal_status(proposal_id, ProposalStatus.APPROVED, ProposalStatus.APPLIED):
            current = store.get_proposal(proposal_id)
            if current is not None and hasattr(current, "applied_to"):
                current.applied_to = str(dest)
                store.put_proposal(current)
            store.add_decision(
                DecisionRecord(
                    proposal_id=proposal_id,
                    reviewer=APPLIER,
                    action=DecisionAction.APPLY,
                    patch_hash=proposal.patch_hash,
                    comment=f"applied to {dest}",
                )
            )
    return str(dest)
