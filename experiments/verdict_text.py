"""What a model (or a person) reads of one finished experiment, each number once.

    experiment exp-1a2b3c4d5e6f on patch 0123456789ab: NO_CHANGE [underpowered]: speedup ...
    - within noise: the interval includes 1.0
    - underpowered: NO_CHANGE only rules out changes of 19.9% or more (...)
    correctness pass on 3 fresh inputs: ...
    health: clean ...
    task criteria:
    - target speedup >= 1.5x: not met (the point estimate is below it)
    extendable: extend=exp-1a2b3c4d5e6f adds up to 12 pairs/arm on the same patch (one experiment)

The verdict itself is `ExperimentResult.render` (store.verdict); the task's criteria come from
`experiments.criteria`; whether more pairs may be asked for from `experiments.extend`.
"""

from __future__ import annotations

from infra_agent.experiments.criteria import criteria_outcome
from infra_agent.experiments.extend import extension_refusal
from infra_agent.store.records import ExperimentRecord
from infra_agent.tasks.manifest import TaskManifest


def verdict_text(record: ExperimentRecord, manifest: TaskManifest) -> str:
    """The experiment's id and patch, its verdict, the task's criteria met or not, and, for an
    unresolved NO_CHANGE, how to ask for more pairs on the same patch."""
    lines = [
        f"experiment {record.id} on patch {record.patch_id[:12]}: {record.result.render()}",
        *criteria_outcome(manifest, record.result),
    ]
    if extension_refusal(record) is None:
        lines.append(
            f"extendable: extend={record.id} adds up to {manifest.budget.max_samples} pairs/arm "
            "on the same patch (one experiment)"
        )
    return "\n".join(lines)
