"""The per-run columns of a batch of chat or RL rows (all but the messages), built column-wise.

`rows.run_row` makes each run's row as Python dicts (rewards, metrics, proposals) that Arrow then
converts back, value by value. Here the batch's experiments and proposals come as arrays
(`evidence.EvidenceColumns`: read from the store's export columns, or off run bundles), their
scores (`rewards.score_results`' matrix) are aggregated per run with numpy
(`RewardFunction.aggregate`: max, mean or min; proven improvement over candidates not flagged
suspicious, as `rewards.aggregate_scores`), the weighted totals of runs and proposals made by
`rewards.weighted_totals` (`weighted_total`'s float operations and rounding), each run's best
candidate picked by one sort (`build.best_candidate`'s choice), its verdicts put in patch order
by another (`rows.by_patch`'s), and the struct and list columns built from arrays; the tool
specs' JSON is made once per distinct list. Python runs per run only for the tool specs of runs
that recorded their own, and for a run whose candidates' speedups include a NaN
(`build.best_candidate` itself).

Every value equals `rows.run_row`'s: tests/trajectories/test_chat_columns.py (runs from a store),
test_evidence.py (the store's columns against the bundles) and test_run_columns.py (in-memory
runs at the corners: ties, NaN speedups, shared experiments) hold the tables equal, Parquet byte
for byte. The means are exact in any order (the components they average take the values -1, 0
and 1; reviews -1, -0.5, 0, 0.5 and 1). Per run of 2 experiments and 1 proposal, on a shared
2-core machine: about 4 us to build, 13 us (rl) for `table`, most of that the message lists.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from infra_agent.experiments.verdict import Verdict
from infra_agent.store.records import RunRecord
from infra_agent.trajectories.build import RunBundle, best_candidate
from infra_agent.trajectories.chat_columns import ChatColumns, lists_of, offsets, per_run_sums
from infra_agent.trajectories.evidence import EvidenceColumns
from infra_agent.trajectories.formats import ARROW_SCHEMAS, JSON_TEXT_COLUMNS, ExportFormat
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import (
    CANDIDATE_REWARDS,
    COMPONENTS,
    VERDICT_ORDER,
    weighted_totals,
)
from infra_agent.trajectories.writers import json_texts

_CANDIDATE = tuple(f.name for f in CANDIDATE_REWARDS)
_PROVEN, _CORRECTNESS = _CANDIDATE.index("proven_improvement"), _CANDIDATE.index("correctness")
_IMPROVED = VERDICT_ORDER.index(Verdict.IMPROVED)
_VERDICTS = [v.value for v in VERDICT_ORDER]
_OUTCOMES = ("not_measured", "passed", "failed")  # `build._accuracy`'s, by code 0, 1, 2
_STRINGS = pa.list_(pa.string())
_REDUCE = {"max": np.maximum, "min": np.minimum, "mean": np.add}
_BY_AGGREGATE = {
    how: [k for k, f in enumerate(CANDIDATE_REWARDS) if f.aggregate == how] for how in _REDUCE
}


class RunColumns:
    """Rewards, verdicts, metrics and proposals of a batch of runs (`runs`, in order), from their
    experiments and proposals as arrays (`evidence.EvidenceColumns`) and the step facts of `chat`
    (`ChatColumns` of the same runs)."""

    def __init__(
        self,
        runs: list[RunRecord],
        evidence: EvidenceColumns,
        chat: ChatColumns,
        weights: dict[str, float],
    ) -> None:
        self.runs, self.evidence, self.chat, self.weights = runs, evidence, chat, weights
        ev = evidence
        n_runs = len(runs)
        counts = ev.counts
        starts = offsets(counts)
        run_of = np.repeat(np.arange(n_runs), counts)
        scored = ev.scored
        matrix, flagged = scored.scores, scored.suspicious

        # Trajectory components: each candidate component aggregated over the run's experiments,
        # and the mean review of the run's proposals.
        components = np.zeros((n_runs, len(COMPONENTS)))
        values = matrix.copy()
        values[flagged, _PROVEN] = -np.inf  # a suspicious win is not a proven one
        for how, columns in _BY_AGGREGATE.items():
            components[:, columns] = _per_run(values[:, columns], starts, how)
        self._proposal_starts = offsets(ev.proposal_counts)
        components[:, -1] = _per_run(ev.reviews, self._proposal_starts, "mean")
        self._components = components
        self.reward = weighted_totals(components, weights)
        self._reward = np.array(self.reward, dtype=np.float64)

        # Each proposal's components: its latest backing experiment's (of its run), plus review.
        backing = ev.backing
        per_proposal = np.zeros((len(backing), len(COMPONENTS)))
        per_proposal[backing >= 0, :-1] = matrix[backing[backing >= 0]]
        per_proposal[:, -1] = ev.reviews
        self._proposal_reward = weighted_totals(per_proposal, weights)
        self._proposal_components = per_proposal
        self._proposal_values: pa.StructArray | None = None
        self.suspicious = per_run_sums(flagged, starts)
        self.n_experiments = counts
        self._starts = starts
        self.reviewed = ev.reviewed
        self._best = self._best_candidates(scored.verdict, matrix, flagged, run_of)

        # The verdicts in patch order (`rows.by_patch`): a run's experiments stably sorted by
        # where their patch first appears in the run.
        order = _by_patch(run_of, ev.patch_ids)
        names = [_VERDICTS[k] for k in scored.verdict[order].tolist()]
        bounds = starts.tolist()
        self.verdicts = [names[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        self._verdict_names = pa.array(names, pa.string())

    @classmethod
    def of_bundles(
        cls, bundles: list[RunBundle], chat: ChatColumns, weights: dict[str, float]
    ) -> RunColumns:
        """The columns of run bundles (`EvidenceColumns.of_bundles`)."""
        return cls([b.run for b in bundles], EvidenceColumns.of_bundles(bundles), chat, weights)

    def table(self, fmt: ExportFormat, kept: list[int], redactor: Redactor | None) -> pa.Table:
        """The `fmt` table of the kept runs' rows (indices into the runs, in order), every
        string redacted when a `redactor` is given; the same table `writers.arrow_table` makes of
        `rows.run_row`'s rows."""
        chat = self.chat
        idx = np.asarray(kept, dtype=np.int64)
        at = pa.array(idx)
        runs = [self.runs[i] for i in kept]
        reviewed = pa.array(self.reviewed[idx])
        speedup, ci_low, ci_high, accuracy = (column.take(at) for column in self._best)
        columns: dict[str, Any] = chat.message_columns(fmt, kept)
        columns["tools_json"] = _tools_json(*chat.tools(kept), redactor)
        ids, tasks = (
            pa.array([r.id for r in runs], pa.string()),
            pa.array([r.task for r in runs], pa.string()),
        )
        reward = pa.array(self._reward[idx], pa.float64())
        verdicts = lists_of(self._verdict_names, self._starts[idx], self._starts[idx + 1], _STRINGS)
        schema = ARROW_SCHEMAS[fmt]
        if fmt is ExportFormat.OPENAI_SFT:
            columns["metadata"] = pa.StructArray.from_arrays(
                [ids, tasks, reward, verdicts, reviewed, speedup],
                fields=list(schema.field("metadata").type),
            )
        else:
            component_type = schema.field("reward_components").type
            columns["session_id"], columns["task"], columns["reward"] = ids, tasks, reward
            columns["reward_components"] = pa.StructArray.from_arrays(
                [pa.array(c) for c in self._components[idx].T], fields=list(component_type)
            )
            columns["reward_weights"] = pa.StructArray.from_arrays(
                [pa.array(np.full(len(kept), self.weights[name])) for name in COMPONENTS],
                fields=list(component_type),
            )
            steps = chat.step_metrics(kept)
            metrics = [
                speedup,
                ci_low,
                ci_high,
                accuracy,
                reviewed,
                self.suspicious[idx],
                steps["n_messages"],
                steps["n_tool_calls"],
                self.n_experiments[idx],
                steps["total_prompt_tokens"],
                steps["total_completion_tokens"],
                steps["total_cost_usd"],
            ]
            metric_type = schema.field("metrics").type
            columns["metrics"] = pa.StructArray.from_arrays(
                [_array(v, f.type) for v, f in zip(metrics, metric_type, strict=True)],
                fields=list(metric_type),
            )
            columns["verdicts"] = verdicts
            columns["proposals"] = self._proposals(kept, schema.field("proposals").type)
        table = pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
        if redactor is None:
            return table
        return redactor.table(table, done={f"{name}_json" for name in JSON_TEXT_COLUMNS[fmt]})

    def _best_candidates(
        self, verdict: np.ndarray, matrix: np.ndarray, flagged: np.ndarray, run_of: np.ndarray
    ) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
        """Each run's best speedup, its CI low and high (Arrow float64, null without a proven
        candidate) and accuracy outcome (Arrow string): `build.best_candidate`'s. The best is the
        first of the run's IMPROVED, unsuspicious experiments with the greatest (proven
        improvement, speedup); the outcome is its correctness, or without one any experiment's."""
        ev, n_runs = self.evidence, len(self.runs)
        correctness = matrix[:, _CORRECTNESS]
        candidates = np.flatnonzero((verdict == _IMPROVED) & ~flagged)
        speedup = np.where(ev.measured[candidates], ev.speedup[candidates], 0.0)
        # Sorted by run, then greatest proven improvement and speedup, then first: the first of
        # each run is its best. A NaN speedup compares as Python's `max` alone knows.
        order = np.lexsort((candidates, -speedup, -matrix[candidates, _PROVEN], run_of[candidates]))
        runs = run_of[candidates[order]]
        first = np.flatnonzero(np.diff(runs, prepend=-1) != 0)
        best = np.full(n_runs, -1, dtype=np.int64)
        best[runs[first]] = candidates[order[first]]
        odd = set(run_of[candidates[np.isnan(speedup)]].tolist())

        # Without a candidate, the outcome is the worst of every experiment's correctness.
        starts = self._starts
        outcome = np.where(per_run_sums(correctness > 0, starts) > 0, 1, 0)
        outcome[per_run_sums(correctness < 0, starts) > 0] = 2
        has = best >= 0
        c = correctness[best[has]]
        outcome[has] = np.where(c < 0, 2, np.where(c > 0, 1, 0))
        shown = np.zeros(n_runs, dtype=bool)
        shown[has] = ev.measured[best[has]]
        k = best[shown]
        values: list[list[Any]] = []
        for column in (ev.speedup, ev.ci_low, ev.ci_high):
            value = np.full(n_runs, np.nan)
            value[shown] = column[k]
            values.append(value.tolist())
        for i in np.flatnonzero(~shown).tolist():
            values[0][i] = values[1][i] = values[2][i] = None
        outcomes = [_OUTCOMES[k] for k in outcome.tolist()]
        for i in odd:  # `build.best_candidate` itself, with the scores already computed
            a, b = int(starts[i]), int(starts[i + 1])
            run = [ev.experiment(k) for k in range(a, b)]
            scores = {e.id: dict(zip(_CANDIDATE, matrix[k].tolist(), strict=True))
                      for e, k in zip(run, range(a, b), strict=True)}  # fmt: skip
            chosen = best_candidate(run, scores)
            values[0][i] = chosen["best_speedup"]
            values[1][i] = chosen["best_speedup_ci_low"]
            values[2][i] = chosen["best_speedup_ci_high"]
            outcomes[i] = chosen["accuracy_outcome"]
        floats = tuple(pa.array(v, pa.float64()) for v in values)
        return floats[0], floats[1], floats[2], pa.array(outcomes, pa.string())

    def _proposals(self, kept: list[int], type_: pa.ListType) -> pa.Array:
        """The kept runs' proposals with their rewards (`build.run_rewards`), a list per run."""
        lo, hi = self._proposal_starts[:-1][kept], self._proposal_starts[1:][kept]
        if self._proposal_values is None:  # the same for every format: built once
            ev, item = self.evidence, type_.value_type
            self._proposal_values = pa.StructArray.from_arrays(
                [
                    ev.proposal_ids,
                    ev.proposal_patch_ids,
                    ev.proposal_status,
                    pa.array(self._proposal_reward, pa.float64()),
                    pa.StructArray.from_arrays(
                        [pa.array(c) for c in self._proposal_components.T],
                        fields=list(item.field("reward_components").type),
                    ),
                ],
                fields=list(item),
            )
        return lists_of(self._proposal_values, lo, hi, type_)


def _by_patch(run_of: np.ndarray, patch_ids: pa.Array) -> np.ndarray:
    """The order of the experiments (runs delimited, patch ids given) that puts each run's in
    `rows.by_patch`'s order: stably by where the experiment's patch first appears in its run."""
    n = len(patch_ids)
    if not n:
        return np.zeros(0, dtype=np.int64)
    codes = patch_ids.dictionary_encode().indices.to_numpy()
    key = run_of * (int(codes.max()) + 1) + codes
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    if len(first) == n:  # no patch twice in a run: already in order
        return np.arange(n)
    return np.argsort(first[inverse.reshape(-1)], kind="stable")


def _tools_json(
    lists: list[list[dict[str, Any]]], index: np.ndarray, redactor: Redactor | None
) -> pa.Array:
    """`writers.json_texts` of each row's tool specs as an Arrow column (`ChatColumns.tools`:
    the distinct lists and each row's): each list encoded and redacted once, and the rows'
    texts joined into the column's data in one copy (about 3x faster than Arrow's `take`)."""
    texts = [t.encode() for t in json_texts(lists, redactor)]
    lengths = np.array([len(t) for t in texts], dtype=np.int64)[index]
    if lengths.sum() >= 2**31:  # past string's 32-bit offsets: Arrow says so
        return pa.array(texts, pa.string()).take(pa.array(index, pa.int64()))
    data = b"".join([texts[k] for k in index.tolist()])  # one copy, memcpy each row's text
    return pa.Array.from_buffers(
        pa.string(),
        len(index),
        [None, pa.py_buffer(offsets(lengths, np.int32)), pa.py_buffer(data)],
    )


def _array(values: Any, type_: pa.DataType) -> pa.Array:
    return values if isinstance(values, pa.Array) else pa.array(values, type_)


def _per_run(values: np.ndarray, starts: np.ndarray, how: str) -> np.ndarray:
    """`values` (a value or a row of them per item, runs delimited by `starts`) aggregated per
    run as `rewards._aggregate` does: max, min or mean; 0.0 for a run with none (or only -inf)."""
    counts = np.diff(starts)
    out = np.zeros((len(counts), *values.shape[1:]))
    some = counts > 0
    if not len(values) or not some.any():
        return out
    reduced = _REDUCE[how].reduceat(values, starts[:-1][some], axis=0)
    if how == "mean":
        reduced = reduced / counts[some].reshape(-1, *[1] * (values.ndim - 1))
    out[some] = np.where(np.isneginf(reduced), 0.0, reduced)
    return out
