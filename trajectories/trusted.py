"""Run bundles for the chat and RL rows from the store's JSON bodies, not validated again.

The store validated every record when it wrote it, so an export of many runs need not rebuild
the records it reads only a few fields of: `load_trusted_runs` gives `build.load_runs(...,
patches=False)`'s bundles with the steps as the parsed bodies (`RunBundle.step_bodies`, what
`rows.run_row` and `chat_columns.ChatColumns` read) and each experiment as a small view holding
only what the rewards, verdicts and best-candidate metrics read (`TrustedExperiment`). Parsing
a step body with orjson costs about a third of pydantic's validation. An experiment's fields are
picked out of its body by the store when it can (`store.base.BodyFields`: SQLite's
`json_extract`, numbers and strings copied as written, then one orjson call per query;
`picked_experiment`), about a tenth of parsing the body with its sample arrays; otherwise the
body is parsed whole (`trusted_experiment`). Proposals, decisions and runs are still read as
validated records (one of each per run).

The safety net is unchanged: the exporter redacts every batch and checks it against the format's
Arrow schema (`writers.check_table`), and tests/trajectories/test_rows.py and
test_chat_columns.py hold these rows equal to the ones from validated records, byte for byte
(`export_dataset(..., trusted_bodies=False)` is that reference path).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, cast

from infra_agent.experiments.verdict import Flag, Verdict
from infra_agent.store.base import BodyFields, ExportColumns, RunStore, TrustedBodies
from infra_agent.store.columns import (
    DECISION_FIELDS,
    EXPERIMENT_FIELDS,
    PROPOSAL_FIELDS,
    experiment_fields,
)
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    ProposalRecord,
    ProposalStatus,
    RunRecord,
)
from infra_agent.trajectories.build import ReviewIndex, RunBundle, add_proposal_experiments


@dataclass(slots=True)
class _Measured:
    """The performance evidence fields the rewards and metrics read."""

    speedup: float
    ci_low: float
    ci_high: float


@dataclass(slots=True)
class _Checked:
    """The correctness evidence fields the rewards read."""

    passed: bool
    baseline_err_f64: float | None
    candidate_err_f64: float | None


@dataclass(slots=True)
class _Evidence:
    performance: _Measured | None
    correctness: _Checked | None


@dataclass(slots=True)
class _Result:
    verdict: Verdict
    flags: list[Flag]
    evidence: _Evidence


@dataclass(slots=True)
class TrustedExperiment:
    """What the chat and RL rows read of an `ExperimentRecord` (its id, patch, and the result's
    verdict, flags, speedup with its CI, correctness), under the record's attribute names, so
    `build.run_rewards`, `build.best_candidate` and the rewards' scoring functions read it as
    they read the record. Built from the stored body without validation (`trusted_experiment`);
    building the whole record (pydantic) costs three times as much, `model_construct` more."""

    id: str
    patch_id: str
    result: _Result


def trusted_experiment(body: dict[str, Any]) -> ExperimentRecord:
    """The `TrustedExperiment` of a stored `ExperimentRecord` body (typed as the record it
    stands for: only the attributes above may be read): `picked_experiment` of the body's values
    at `EXPERIMENT_PATHS`."""
    return picked_experiment(experiment_fields(body))


EXPERIMENT_PATHS = EXPERIMENT_FIELDS
"""What `TrustedExperiment` reads of a stored experiment body (`store.base.BodyFields`)."""


_VERDICTS = {v.value: v for v in Verdict}
_FLAGS = {f.value: f for f in Flag}


def picked_experiment(values: list[Any]) -> ExperimentRecord:
    """`trusted_experiment` of the values at `EXPERIMENT_PATHS` of a stored body."""
    id_, patch_id, verdict, flags, metric, speedup, lo, hi, passed, b_err, c_err = values
    view = TrustedExperiment(
        id_,
        patch_id,
        _Result(
            _VERDICTS.get(verdict) or Verdict(verdict),
            [_FLAGS.get(f) or Flag(f) for f in flags] if flags else [],
            _Evidence(
                _Measured(speedup, lo, hi) if metric is not None else None,
                _Checked(passed, b_err, c_err) if passed is not None else None,
            ),
        ),
    )
    return cast(ExperimentRecord, view)


PROPOSAL_PATHS = PROPOSAL_FIELDS
DECISION_PATHS = DECISION_FIELDS


@dataclass(slots=True)
class TrustedProposal:
    """What the chat and RL rows read of a `ProposalRecord` (`build.run_rewards`,
    `rewards.review_score`, `build.add_proposal_experiments`), under the record's names."""

    id: str
    run_id: str | None
    patch_id: str
    patch_hash: str
    experiment_ids: list[str]
    status: ProposalStatus


@dataclass(slots=True)
class TrustedDecision:
    """What the rows read of a `DecisionRecord` (`rewards.review_score`, `RunBundle.reviewed`)."""

    proposal_id: str
    action: DecisionAction
    patch_hash: str


class TrustedReview(ReviewIndex):
    """`build.ReviewIndex` with proposals and decisions as `TrustedProposal` / `TrustedDecision`
    views of the bodies' fields, read from the store's export columns
    (`store.base.ExportColumns.review_columns`) or picked out of its bodies
    (`store.base.BodyFields.review_fields`): for the chat and RL rows only
    (`load_trusted_runs`), which read no other field."""

    def __init__(self, store: BodyFields) -> None:
        picked = store.review_columns() if isinstance(store, ExportColumns) else None
        if picked is None:
            picked = store.review_fields(PROPOSAL_PATHS, DECISION_PATHS)
        proposals, decisions = picked
        status = {s.value: s for s in ProposalStatus}
        action = {a.value: a for a in DecisionAction}
        self.proposals = defaultdict(list)
        for id_, run_id, patch_id, patch_hash, experiment_ids, state in proposals:
            view = TrustedProposal(id_, run_id, patch_id, patch_hash, experiment_ids or [],
                                   status.get(state) or ProposalStatus(state))  # fmt: skip
            self.proposals[run_id].append(cast(ProposalRecord, view))
        self.decisions = defaultdict(list)
        for proposal_id, act, patch_hash in decisions:
            decision = TrustedDecision(
                proposal_id, action.get(act) or DecisionAction(act), patch_hash
            )
            self.decisions[proposal_id].append(cast(DecisionRecord, decision))


def load_trusted_runs(
    store: RunStore, runs: list[RunRecord], review: ReviewIndex, *, steps: bool = True
) -> list[RunBundle]:
    """`build.load_runs(store, runs, review, patches=False)` from the store's trusted bodies
    (`store.base.TrustedBodies`): the same rows come out of `rows.run_row`. `store` must offer
    `TrustedBodies`. With `steps=False` the bundles carry no steps at all (`step_bodies` None):
    for callers that read them as columns (`store.base.ExportColumns`)."""
    bodies = cast(TrustedBodies, store)
    ids = [run.id for run in runs]
    step_bodies = bodies.step_bodies_of_runs(ids) if steps else {}
    experiments = _experiments(store, ids)
    bundles = []
    for run in runs:
        proposals = list(review.proposals.get(run.id, []))
        run_experiments: list[Any] = list(experiments.get(run.id, []))
        add_proposal_experiments(store, proposals, run_experiments)
        bundles.append(
            RunBundle(
                run=run,
                steps=[],
                experiments=run_experiments,
                proposals=proposals,
                decisions={p.id: list(review.decisions.get(p.id, [])) for p in proposals},
                step_bodies=step_bodies.get(run.id, []) if steps else None,
            )
        )
    return bundles


def _experiments(store: RunStore, ids: list[str]) -> dict[str, list[ExperimentRecord]]:
    """The `TrustedExperiment` views of the runs' experiments: from the store's export columns,
    else the fields it picks out of the bodies, else the whole bodies."""
    picked = None
    if isinstance(store, ExportColumns):
        picked = store.experiment_columns_of_runs(ids)
    if picked is None and isinstance(store, BodyFields):
        picked = store.experiment_fields_of_runs(ids, EXPERIMENT_PATHS)
    if picked is not None:
        return {k: [picked_experiment(v) for v in vs] for k, vs in picked.items()}
    whole = cast(TrustedBodies, store).experiment_bodies_of_runs(ids)
    return {k: [trusted_experiment(b) for b in bs] for k, bs in whole.items()}
