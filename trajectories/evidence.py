"""The experiments and proposals of a batch of runs as arrays: what `run_columns.RunColumns` reads.

`EvidenceColumns.of_bundles` reads them off run bundles (`build.RunBundle`, records or trusted
views); `EvidenceColumns.of_store` straight from the store's export columns as Arrow tables (the
experiments of the batch's runs, `store.base.ExportColumns.experiment_table_of_runs`, and every
proposal and decision, read once per export into `ReviewColumns`), with no Python object per
experiment or proposal: verdicts, flags and correctness become codes with Arrow compute, each
proposal's review score and backing experiment are found by joins over arrays. The proven
improvement of each IMPROVED experiment is `rewards.improvement` of its numbers (the function
`rewards.proven_improvement` itself calls); an experiment becomes a small view
(`trusted.picked_experiment`) only where a rare path asks for one.

`of_store` gives None for a batch that is not in the common shape, and the exporter then builds
the bundles (`trusted.load_trusted_runs`) and `of_bundles` of them, which is always exact: a
proposal that names an experiment its run does not hold (`build.add_proposal_experiments` would
fetch it from the store), a verdict, flag, decision action or proposal status this version does
not know (the bundle path raises the error), or performance evidence without its numbers (a NaN
stored as NULL). tests/trajectories/test_evidence.py holds both equal on random stores, and the
Parquet exports byte for byte the row path's. Per run of 2 experiments and 1 proposal: about 6 us.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from infra_agent.experiments.verdict import ExperimentResult, Flag, Verdict
from infra_agent.store.columns import experiment_rows, one_array
from infra_agent.store.records import DecisionAction, ExperimentRecord, ProposalStatus, RunRecord
from infra_agent.trajectories.build import RunBundle
from infra_agent.trajectories.chat_columns import (
    index_codes,
    offsets,
    per_run_sums,
    string_codes,
)
from infra_agent.trajectories.rewards import (
    _STATUS_SCORES,
    REVIEW_SCORES,
    VERDICT_ORDER,
    ScoredResults,
    improvement,
    review_score,
    score_columns,
    score_results,
)
from infra_agent.trajectories.trusted import picked_experiment

_VERDICT_NAMES = pa.array([v.value for v in VERDICT_ORDER])
_IMPROVED = VERDICT_ORDER.index(Verdict.IMPROVED)
_ACTIONS = list(DecisionAction)
_ACTION_NAMES = pa.array([a.value for a in _ACTIONS])
_ACTION_SCORE = np.array([REVIEW_SCORES.get(a, np.nan) for a in _ACTIONS])
_AUTO = _ACTIONS.index(DecisionAction.AUTO_APPROVE)
_STATUSES = list(ProposalStatus)
_STATUS_NAMES = pa.array([s.value for s in _STATUSES])
_STATUS_SCORE = np.array([_STATUS_SCORES.get(s, 0.0) for s in _STATUSES])
_FLAG_VALUES = {f.value for f in Flag}
_PROVEN_FROM = ("ci_low", "baseline_err_f64", "candidate_err_f64")


@dataclass
class EvidenceColumns:
    """A batch's experiments (runs end to end, each run's in store order) and proposals."""

    n_runs: int
    counts: np.ndarray
    """Experiments per run (int64)."""
    ids: pa.Array
    """Experiment ids (string)."""
    patch_ids: pa.Array
    """Each experiment's patch id (string)."""
    scored: ScoredResults
    """The experiments' verdicts, flags and `candidate_scores` (`rewards.score_results`)."""
    measured: np.ndarray
    """Whether the experiment has performance evidence (bool)."""
    speedup: np.ndarray
    """Its speedup, CI low and high (float64; 0.0 where not measured)."""
    ci_low: np.ndarray
    ci_high: np.ndarray
    experiment: Callable[[int], ExperimentRecord]
    """Experiment k as a record or a view of one (for the rare paths that need one)."""
    proposal_counts: np.ndarray
    """Proposals per run (int64)."""
    proposal_ids: pa.Array
    proposal_patch_ids: pa.Array
    proposal_status: pa.Array
    """Each proposal's status value (string)."""
    reviews: np.ndarray
    """Each proposal's `rewards.review_score` (float64)."""
    backing: np.ndarray
    """Each proposal's latest backing experiment among its run's (index; -1 when none)."""
    reviewed: np.ndarray
    """Per run: a person (not the auto-approve policy) decided on one of its proposals."""

    @classmethod
    def of_bundles(cls, bundles: list[RunBundle]) -> EvidenceColumns:
        """The evidence of run bundles (their experiments, proposals and decisions)."""
        experiments = [e for b in bundles for e in b.experiments]
        counts = np.array([len(b.experiments) for b in bundles], dtype=np.int64)
        perfs = [e.result.evidence.performance for e in experiments]
        measured = np.array([p is not None for p in perfs], dtype=bool)
        values = [tuple(_number(x) for x in (p.speedup, p.ci_low, p.ci_high))
                  if p is not None else (0.0, 0.0, 0.0) for p in perfs]  # fmt: skip
        speedup, ci_low, ci_high = np.array(values, dtype=np.float64).reshape(-1, 3).T
        proposals = [p for b in bundles for p in b.proposals]
        p_counts = np.array([len(b.proposals) for b in bundles], dtype=np.int64)
        reviews = np.array(
            [review_score(p, b.decisions.get(p.id, [])) for b in bundles for p in b.proposals],
            dtype=np.float64,
        )
        run_of = np.repeat(np.arange(len(bundles)), counts).tolist()
        where = dict(zip(zip(run_of, [e.id for e in experiments], strict=True),
                         range(len(experiments)), strict=True))  # fmt: skip
        backing = np.array(
            [_latest(where, i, p.experiment_ids) for i, b in enumerate(bundles) for p in b.proposals],
            dtype=np.int64,
        )  # fmt: skip
        auto = DecisionAction.AUTO_APPROVE
        reviewed = np.zeros(len(bundles), dtype=bool)
        reviewed[[i for i, b in enumerate(bundles) for ds in b.decisions.values()
                  for d in ds if d.action is not auto]] = True  # fmt: skip
        return cls(
            n_runs=len(bundles),
            counts=counts,
            ids=pa.array([e.id for e in experiments], pa.string()),
            patch_ids=pa.array([e.patch_id for e in experiments], pa.string()),
            scored=score_results([e.result for e in experiments]),
            measured=measured,
            speedup=speedup,
            ci_low=ci_low,
            ci_high=ci_high,
            experiment=experiments.__getitem__,
            proposal_counts=p_counts,
            proposal_ids=pa.array([p.id for p in proposals], pa.string()),
            proposal_patch_ids=pa.array([p.patch_id for p in proposals], pa.string()),
            proposal_status=pa.array([p.status.value for p in proposals], pa.string()),
            reviews=reviews,
            backing=backing,
            reviewed=reviewed,
        )

    @classmethod
    def of_store(
        cls, runs: list[RunRecord], experiments: pa.Table, review: ReviewColumns
    ) -> EvidenceColumns | None:
        """The evidence of `runs` from the store's columns: `experiments` the table of their
        experiments (`store.columns.ColumnReader.experiment_table`), `review` every proposal and
        decision. None when the batch is not in the common shape (module doc)."""
        if not review.known:
            return None
        n_runs = len(runs)
        run_of = experiments.column("run").to_numpy()
        counts = np.bincount(run_of, minlength=n_runs).astype(np.int64)
        verdict = pc.index_in(experiments.column("verdict"), value_set=_VERDICT_NAMES)
        metric = experiments.column("metric").is_valid().to_numpy(zero_copy_only=False)
        numbers = [experiments.column(c) for c in ("speedup", "ci_low", "ci_high")]
        if verdict.null_count or any(
            (~c.is_valid().to_numpy(zero_copy_only=False) & metric).any() for c in numbers
        ):
            return None
        n = experiments.num_rows
        suspicious, health = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        flag_texts = experiments.column("flags")
        if flag_texts.null_count < n:  # rare: most experiments carry no flag
            for k, text in _valid(flag_texts):
                flags = orjson.loads(text)
                if not set(flags) <= _FLAG_VALUES:
                    return None
                suspicious[k] = Flag.SUSPICIOUS.value in flags
                health[k] = Flag.HEALTH_WARNING.value in flags
        passed = experiments.column("passed")
        checked = np.where(
            passed.is_valid().to_numpy(zero_copy_only=False),
            np.where(pc.fill_null(passed, 0).to_numpy(zero_copy_only=False) != 0, 1.0, -1.0),
            0.0,
        )
        codes = index_codes(verdict).astype(np.int8)
        improved = pa.array(np.flatnonzero(codes == _IMPROVED))
        values = [experiments.column(c).take(improved).to_pylist() for c in _PROVEN_FROM]
        proven = np.zeros(n)
        proven[improved.to_numpy()] = [
            improvement(lo, b, c, measured=m)
            for lo, b, c, m in zip(*values, metric[improved.to_numpy()].tolist(), strict=True)
        ]
        views = _Views(experiments)
        scored = score_columns(codes, suspicious, health, checked, views.results(), proven)

        index, p_counts = review.of_runs([run.id for run in runs])
        backing = review.backing(index, p_counts, run_of, experiments.column("id"))
        if backing is None:
            return None
        human = review.human[index]
        at = pa.array(index)
        speedup, ci_low, ci_high = (pc.fill_null(c, 0.0).to_numpy() for c in numbers)
        return cls(
            n_runs=n_runs,
            counts=counts,
            ids=one_array(experiments.column("id")),
            patch_ids=one_array(experiments.column("patch_id")),
            scored=scored,
            measured=metric,
            speedup=speedup,
            ci_low=ci_low,
            ci_high=ci_high,
            experiment=views.experiment,
            proposal_counts=p_counts,
            proposal_ids=review.ids.take(at),
            proposal_patch_ids=review.patch_ids.take(at),
            proposal_status=review.status.take(at),
            reviews=review.scores[index],
            backing=backing,
            reviewed=per_run_sums(human, offsets(p_counts)) > 0,
        )


class ReviewColumns:
    """Every proposal of a store with its review score (`rewards.review_score` of its
    decisions), whether a person decided on it, and its backing experiment ids, as arrays; read
    once per export (`store.base.ExportColumns.review_tables`)."""

    def __init__(self, proposals: pa.Table, decisions: pa.Table) -> None:
        self.ids = one_array(proposals.column("id"))
        self.patch_ids = one_array(proposals.column("patch_id"))
        self.status = one_array(proposals.column("status"))
        status = pc.index_in(self.status, value_set=_STATUS_NAMES)
        action = pc.index_in(decisions.column("action"), value_set=_ACTION_NAMES)
        of = pc.index_in(decisions.column("proposal_id"), value_set=self.ids)
        self.known = not (status.null_count or action.null_count)
        # A decision without its proposal belongs to no run's bundle: it counts nowhere.
        has = of.is_valid().to_numpy(zero_copy_only=False)
        of_k, act = index_codes(of)[has], index_codes(action)[has]
        hashes = proposals.column("patch_hash").take(pa.array(of_k))
        same = pc.equal(decisions.column("patch_hash").filter(pa.array(has)), hashes)
        judged = pc.fill_null(same, False).to_numpy(zero_copy_only=False)
        judged &= ~np.isnan(_ACTION_SCORE[act])
        # Each proposal's last judgement on its exact patch (decisions are in time order).
        last = np.full(len(self.ids), -1, dtype=np.int64)
        np.maximum.at(last, of_k[judged], np.flatnonzero(judged))
        self.scores = _STATUS_SCORE[index_codes(status)]
        decided = last >= 0
        self.scores[decided] = _ACTION_SCORE[act[last[decided]]]
        self.human = np.zeros(len(self.ids), dtype=bool)
        self.human[of_k[act != _AUTO]] = True
        texts = proposals.column("experiment_ids").to_pylist()
        self.experiment_ids = pa.array(
            orjson.loads("[" + ",".join(texts) + "]"), pa.list_(pa.string())
        )
        # The proposals grouped by run (each run's in store order): where each run's start.
        runs = pc.dictionary_encode(one_array(proposals.column("run_id")))
        of_run = index_codes(runs.indices)
        some = np.flatnonzero(of_run >= 0)  # a proposal without a run is in no run's bundle
        self._order = some[np.argsort(of_run[some], kind="stable")]
        counts = np.bincount(of_run[some], minlength=len(runs.dictionary))
        starts = offsets(counts)[:-1]
        self._span: dict[str, tuple[int, int]] = dict(
            zip(runs.dictionary.to_pylist(), zip(starts.tolist(), counts.tolist(), strict=True),
                strict=True)
        )  # fmt: skip

    def of_runs(self, run_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The proposals of runs `run_ids`: their indices (runs in that order, each run's in
        store order) and how many each run has."""
        span, none = self._span, (0, 0)
        starts, counts = (
            np.array([span.get(r, none) for r in run_ids], dtype=np.int64).reshape(-1, 2).T
        )
        within = np.arange(int(counts.sum())) - np.repeat(offsets(counts)[:-1], counts)
        return self._order[np.repeat(starts, counts) + within], counts

    def backing(
        self,
        index: np.ndarray,
        counts: np.ndarray,
        run_of: np.ndarray,
        experiment_ids: pa.ChunkedArray,
    ) -> np.ndarray | None:
        """The latest backing experiment of each proposal `index` (`counts` per run, as
        `of_runs` gives them): an index into the batch's experiments (`run_of`, `experiment_ids`),
        the last of the proposal's `experiment_ids`; -1 when it names none. None when one names
        an experiment its run does not hold (`build.add_proposal_experiments` would read it from
        the store)."""
        run_of_p = np.repeat(np.arange(len(counts)), counts)
        lists = self.experiment_ids.take(pa.array(index))
        lengths = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
        named = pc.list_flatten(lists)
        if not len(named):
            return np.full(len(index), -1, dtype=np.int64)
        (held_code, named_code), width = string_codes(experiment_ids, named)
        held = run_of * width + held_code  # (run, experiment id) pairs: one per experiment
        wanted = np.repeat(run_of_p, lengths) * width + named_code
        if not len(held):
            return None
        order = np.argsort(held, kind="stable")
        at = order[np.minimum(np.searchsorted(held, wanted, sorter=order), len(held) - 1)]
        if (held[at] != wanted).any():
            return None
        ends = offsets(lengths)[1:] - 1
        return np.where(lengths > 0, at[np.maximum(ends, 0)], -1)


class _Views:
    """Experiments of a table as `trusted.TrustedExperiment` views, made on demand (the whole
    table converted once, when the first is asked for)."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table
        self._made: dict[int, ExperimentRecord] = {}
        self._all: list[list[Any]] | None = None

    def experiment(self, k: int) -> ExperimentRecord:
        made = self._made.get(k)
        if made is None:
            if self._all is None:
                self._all = experiment_rows(self._table)
            made = self._made[k] = picked_experiment(self._all[k])
        return made

    def results(self) -> Sequence[ExperimentResult]:
        """The results of all rows, as a sequence that makes each on demand."""
        return _Results(self, self._table.num_rows)


class _Results(Sequence[ExperimentResult]):
    def __init__(self, views: _Views, n: int) -> None:
        self._views, self._n = views, n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, k: int) -> ExperimentResult: ...
    @overload
    def __getitem__(self, k: slice) -> Sequence[ExperimentResult]: ...
    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self._n))]
        if not -self._n <= k < self._n:
            raise IndexError(k)
        return self._views.experiment(k % self._n).result


def _latest(where: dict[tuple[int, str], int], run: int, experiment_ids: list[str]) -> int:
    """The index of the last of `experiment_ids` among run `run`'s experiments (`where`), -1
    when none is."""
    for x in reversed(experiment_ids):
        k = where.get((run, x))
        if k is not None:
            return k
    return -1


def _number(value: float | None) -> float:
    """A stored number; NaN for one read back as null (SQLite and JSON keep NaN and infinities
    as null): only a best candidate's numbers are read, and `build.best_candidate` refuses a
    missing one as the row path does."""
    return float("nan") if value is None else value


def _valid(column: pa.ChunkedArray) -> list[tuple[int, Any]]:
    """(index, value) of the non-null values of a column."""
    at = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    return list(zip(at.tolist(), column.take(pa.array(at)).to_pylist(), strict=True))
