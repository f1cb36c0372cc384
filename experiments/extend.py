"""More pairs for an unresolved NO_CHANGE: an extension continues an experiment on the same arms.

A NO_CHANGE flagged `underpowered` (its interval could not resolve the effect asked for), or one
whose sampling ended at the budget before the measurement settled (the sign test overruling the
bootstrap, a constraint not yet shown either way, a rate difference not yet shown), says only
that the budget ran out. An extension runs the whole cascade again on fresh arms of the same
patch (static rules, correctness on fresh inputs, the performance stage, health) and starts its
performance stage from the earlier experiment's pairs: the statistics see the earlier and the new
pairs together, the stopping rule applies to all of them, and at most the task's `max_samples`
new pairs (and `measure_budget_s`) are added. Each pair is one baseline and one candidate sample
measured next to each other on the same inputs, so pairs from two sessions of arms pool as pairs.

Earlier pairs are reused only when the arms are the same: the same task, the same baseline
(`target_fingerprint`: manifest, harness, deployment, workspace), the same patch (so the same
knobs), the same task parameters and the same sandbox backend. Any other verdict is refused in
one line that says what to do instead. Deciding to extend after seeing a NO_CHANGE is a second
look at the data; the verdict rule (the interval clear of half the minimum effect and the sign
test agreeing) keeps that honest enough to state, and the verdict says it was extended.

    earlier = extendable(store, run_id, "exp-...")  # the record, or UserError saying why not
    run_experiment(task, patch, extend=earlier)     # its pairs first (experiments.cascade)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra_agent.errors import UserError
from infra_agent.store.base import RunStore
from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import Flag, StopReason, Verdict


@dataclass(frozen=True)
class Prior:
    """The pairs an extension continues from: both arms' samples, every key, in measurement
    order."""

    experiment_id: str
    baseline: dict[str, list[float]]
    candidate: dict[str, list[float]]
    wanted: float | None
    """The detectable effect the earlier experiment asked for (kept by the extension)."""

    @property
    def pairs(self) -> int:
        return min((len(v) for v in [*self.baseline.values(), *self.candidate.values()]), default=0)

    @classmethod
    def of(cls, record: ExperimentRecord) -> Prior:
        """The pairs of an extendable experiment (check `extension_refusal` first)."""
        perf = record.result.evidence.performance
        assert perf is not None and perf.all_samples, "not extendable: no samples recorded"
        return cls(
            experiment_id=record.id,
            baseline={k: list(v) for k, v in perf.all_samples["baseline"].items()},
            candidate={k: list(v) for k, v in perf.all_samples["candidate"].items()},
            wanted=perf.wanted_effect,
        )


def unresolved(record: ExperimentRecord) -> bool:
    """A NO_CHANGE that more pairs could settle: flagged underpowered, or sampling stopped at
    the budget before the measurement settled."""
    result, perf = record.result, record.result.evidence.performance
    if result.verdict is not Verdict.NO_CHANGE or perf is None:
        return False
    stopped_short = perf.stopped is not None and perf.stopped is not StopReason.RESOLVED
    return Flag.UNDERPOWERED in result.flags or stopped_short


def extension_refusal(record: ExperimentRecord) -> str | None:
    """Why `record` cannot be extended, in one line a model can act on; None when it can."""
    result, perf = record.result, record.result.evidence.performance
    verdict = result.verdict
    if verdict in (Verdict.IMPROVED, Verdict.REGRESSED):
        return (
            f"{record.id} is {verdict.value}: decided, more pairs would not change it; "
            "propose another patch to go further"
        )
    if perf is None:
        stage = result.evidence.stage_reached or "first"
        return (
            f"{record.id} ended {verdict.value} at the {stage} stage: it has no pairs to extend; "
            "fix the patch and propose it again"
        )
    if not unresolved(record):
        seen = ""
        if perf.detectable_effect is not None and perf.wanted_effect is not None:
            seen = f" (it detects changes of {perf.detectable_effect - 1:.1%} or more; {perf.wanted_effect - 1:.1%} was asked)"  # fmt: skip
        return (
            f"{record.id} is a resolved {verdict.value}{seen}: more pairs would not change it; "
            "try a different patch"
        )
    if not perf.all_samples:
        return f"{record.id} was recorded without its samples; run the patch as a new experiment"
    return None


def same_arms_refusal(
    record: ExperimentRecord,
    *,
    task: str,
    fingerprint: str,
    patch_id: str,
    params: dict[str, Any],
    sandbox: str,
) -> str | None:
    """Why the earlier pairs of `record` cannot be pooled with new pairs of these arms (what
    differs), or None when the arms are the same."""
    differs = [
        what
        for what, same in (
            ("task", record.task == task),
            ("baseline (task version)", record.target_fingerprint == fingerprint),
            ("patch", record.patch_id == patch_id),
            ("task parameters", record.result.evidence.params == params),
            ("sandbox backend", record.sandbox == sandbox),
        )
        if not same
    ]
    if not differs:
        return None
    return (
        f"{record.id} ran on other arms (a different {', '.join(differs)}): its pairs cannot be "
        "pooled with these; measure the patch as a new experiment"
    )


def extendable(store: RunStore, run_id: str | None, experiment_id: str) -> ExperimentRecord:
    """The experiment of run `run_id` named `experiment_id`, when it may be extended; else a
    UserError whose one line says why and what to do instead."""
    record = store.get_experiment(experiment_id)
    if record is None or record.run_id != run_id:
        raise UserError(
            f"not extended: no experiment {experiment_id!r} in this run; extend takes the id an "
            "experiment's answer starts with (experiment exp-...)"
        )
    later = [
        e.id
        for e in store.experiments(run_id)
        if e.result.evidence.performance is not None
        and e.result.evidence.performance.extended_from == record.id
    ]
    if later:
        raise UserError(f"not extended: {record.id} was extended already, by {later[-1]}; extend that one")  # fmt: skip
    why = extension_refusal(record)
    if why is not None:
        raise UserError(f"not extended: {why}")
    return record
