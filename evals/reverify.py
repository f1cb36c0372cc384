"""Claims disproved: an attempt's best win measured once more, on fresh seeds, after its run.

The win re-measured is the one the eval would count: chosen by the rule of the hand-off to a
reviewer (`agent.handoff.best_improved`: the highest 95% CI low end) among the IMPROVED
experiments not flagged suspicious (those go to a person and never count). It runs again through
`experiments.run_experiment`, the path the agent's run_experiment tool takes, with the run's
sandbox and task parameters and a statistics seed the run never used (every experiment draws its
input seeds fresh from os.urandom); an unresolved NO_CHANGE is extended once, and a failed
baseline tried once more. A re-measurement that is not IMPROVED, or is flagged suspicious,
disproves the claim; one whose baseline never ran leaves it not verified.
The new experiment is stored without a run (the agent never saw it); the attempt keeps its id.
"""

from __future__ import annotations

from pathlib import Path

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.handoff import best_improved
from infra_agent.agent.state import AgentState, ExperimentOutcome
from infra_agent.errors import UserError
from infra_agent.evals.records import Reverification
from infra_agent.experiments import run_experiment
from infra_agent.experiments.extend import extension_refusal
from infra_agent.store import open_store
from infra_agent.store.base import RunStore
from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import Flag, Verdict
from infra_agent.tasks.patch import Patch
from infra_agent.tasks.registry import find_task

SEED_OFFSET = 1_000_000
"""A run's experiments take statistics seeds `config.seed + 0, 1, ...` (one per experiment, and
attempt k runs with config.seed k), so seeds from here on are ones no run of an eval used."""


def best_win(store: RunStore, run_id: str) -> ExperimentRecord | None:
    """The run's proven winner not flagged suspicious, chosen by the hand-off's rule."""
    experiments = sorted(store.experiments(run_id), key=lambda e: e.started_at)
    outcomes = [ExperimentOutcome.of(e, store.get_patch(e.patch_id), reused=False) for e in experiments]  # fmt: skip
    counted = [o for o in outcomes if Flag.SUSPICIOUS not in o.flags]
    best = best_improved(AgentState(run_id=run_id, experiments=counted))
    return store.get_experiment(best.experiment_id) if best is not None else None


BASELINE_TRIES = 2
"""Tries of the re-measurement while its baseline arm fails (a server that does not start on
a loaded machine): after them the claim is recorded as not verified, not as disproved."""


def reverify(store_path: Path, run_id: str) -> Reverification | None:
    """Re-measure the run's best win (None when it has none); the new experiment is stored. A
    re-measurement whose baseline failed runs once more; one that ended NO_CHANGE unresolved
    (underpowered, or sampling stopped at the budget) is extended once with more pairs, as the
    run could extend its own: an 8-pair budget alone is no disproof of a win that took more."""
    store = open_store(store_path)
    try:
        run = store.get_run(run_id)
        if run is None:
            raise UserError(f"run {run_id} is not in the store")
        win = best_win(store, run_id)
        if win is None:
            return None
        patch = store.get_patch(win.patch_id)
        if patch is None:
            raise UserError(f"patch {win.patch_id} of experiment {win.id} is not in the store")
        config = RunConfig.model_validate(run.config)
        seed = SEED_OFFSET + config.seed + len(store.experiments(run_id))
        for tried in range(BASELINE_TRIES):  # a failed baseline says nothing of the patch
            record = run_experiment(
                find_task(config.task_root or config.task), Patch.from_record(patch),
                sandbox=config.sandbox, params=config.params or None, store=store, run_id=None,
                seed=seed + tried,
            )  # fmt: skip
            if Flag.BASELINE_FAILED not in record.result.flags:
                break
        seed += tried
        if extension_refusal(record) is None:  # an unresolved NO_CHANGE: more pairs settle it
            record = run_experiment(
                find_task(config.task_root or config.task), Patch.from_record(patch),
                sandbox=config.sandbox, params=config.params or None, store=store, run_id=None,
                seed=seed + 1, extend=record,
            )  # fmt: skip
    finally:
        store.close()
    perf = record.result.evidence.performance
    unverified = Flag.BASELINE_FAILED in record.result.flags
    improved = record.result.verdict is Verdict.IMPROVED
    return Reverification(
        experiment_id=record.id,
        of_experiment=win.id,
        patch_id=win.patch_id,
        seed=seed,
        verdict=record.result.verdict.value,
        flags=[f.value for f in record.result.flags],
        speedup=perf.speedup if perf else None,
        ci_low=perf.ci_low if perf else None,
        disproved=not unverified and (not improved or Flag.SUSPICIOUS in record.result.flags),
        unverified=unverified,
        reason="" if improved else next(iter(record.result.reasons), "")[:600],
    )
