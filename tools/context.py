"""What a tool call can reach: the run's task, its store, and where its sandboxes run."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from infra_agent.tools.kept_servers import KeptServers

PATCH_ID_PREFIX = 8
"""A patch id's first characters that name it, where they name one patch of the run."""

if TYPE_CHECKING:
    from infra_agent.store import RunStore
    from infra_agent.tasks.checked import CheckedPatch
    from infra_agent.tasks.manifest import Task
    from infra_agent.tasks.patch import Patch
    from infra_agent.tools.looks import LookServer


@dataclass
class ToolContext:
    """Everything the tools of one run share. Built by the runner; never serialized."""

    task: Task
    store: RunStore
    run_id: str
    sandbox: str = "local"
    """Sandbox backend for instruments and experiments ('local' or 'docker')."""
    params: dict[str, Any] = field(default_factory=dict)
    """Task scale parameter overrides for this run."""
    author: str = "agent"
    """Provenance written on patches the model proposes (the policy or model name)."""
    known_patches: list[str] = field(default_factory=list)
    """Ids of the patches proposed so far in this run (kept in the graph state)."""
    checked: dict[str, CheckedPatch] = field(default_factory=dict)
    """Patch id -> the patch as its proposal checked it, for its experiment to reuse."""
    looks_used: int = 0
    """Looks (serving_workload, server_steps, server_profile) run so far in this run (kept in
    the graph state's usage)."""
    looks_limit: int | None = None
    """The run's looks budget (None: no limit, as for a person's `feedback run`)."""
    look_servers: KeptServers[LookServer] = field(default_factory=KeptServers)
    """The servers looks ran on, kept for later looks at the same patch (`tools.looks`)."""

    def close(self) -> None:
        """Release what the run's tools keep between calls: stop the look servers."""
        self.look_servers.close()

    def patch(self, patch_id: str) -> Patch:
        """A patch proposed earlier in this run (kept in the store, so it survives a resume)."""
        from infra_agent.errors import UserError
        from infra_agent.tasks.patch import Patch

        record = self.store.get_patch(self.full_patch_id(patch_id))
        if record is None:
            known = ", ".join(self.known_patches) or "none yet"
            raise UserError(
                f"no patch with id '{patch_id}' (patch ids in this run: {known}); "
                "propose or edit a patch first (its answer gives the patch_id)"
            )
        return Patch.from_record(record)

    def full_patch_id(self, given: str) -> str:
        """The id of this run's patch that `given` begins (at least `PATCH_ID_PREFIX`
        characters, one patch only), else `given` as it is."""
        if len(given) < PATCH_ID_PREFIX or self.store.get_patch(given) is not None:
            return given
        found = {p for p in self.known_patches if p.startswith(given)}
        return found.pop() if len(found) == 1 else given

    def checked_patch(self, patch_id: str) -> CheckedPatch:
        """A patch proposed earlier in this run with its check (`tasks.checked`): as its proposal
        checked it, or, when this process did not (a resumed run), checked now."""
        from infra_agent.tasks.checked import check_patch

        stored = self.patch(patch_id)  # the stored provenance (the first proposal's)
        found = self.checked.get(patch_id)
        if found is None:
            found = self.checked[patch_id] = check_patch(stored, self.task)
        return replace(found, patch=stored)
