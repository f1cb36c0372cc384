"""The per-run columns of a batch of chat or RL rows (all but the messages), built column-wise.

`rows.run_row` makes each run's row as Python dicts (rewards, metrics, proposals) that Arrow then
converts back, value by value. Here the batch's experiments are scored once each (the scalar
reward functions, `rewards.candidate_scores`: one definition of every component), the scores
stacked into a matrix and aggregated per run with numpy (`RewardFunction.aggregate`: max, mean
or min; proven improvement over candidates not flagged suspicious, as
`rewards.aggregate_scores`), the weighted totals summed component by component in
`COMPONENTS` order and rounded by Python's `round` (the same float operations as
`rewards.weighted_total`), and the struct columns built from the arrays. Python still runs per
run for what is per run and small: the verdicts in patch order, the review, the tool specs, the
best candidate among the run's proven ones, and each proposal's reward.

Every value equals `rows.run_row`'s: tests/trajectories/test_chat_columns.py holds the tables
equal, Parquet byte for byte. The means are exact in any order (the components they average take
the values -1, 0 and 1; reviews -1, -0.5, 0, 0.5 and 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from infra_agent.experiments.verdict import Flag, Verdict
from infra_agent.trajectories.build import RunBundle, best_candidate
from infra_agent.trajectories.chat_columns import ChatColumns, lists_of, offsets, per_run_sums
from infra_agent.trajectories.formats import ARROW_SCHEMAS, JSON_TEXT_COLUMNS, ExportFormat
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import (
    CANDIDATE_REWARDS,
    COMPONENTS,
    candidate_scores,
    review_score,
)
from infra_agent.trajectories.rows import by_patch
from infra_agent.trajectories.writers import json_texts

_CANDIDATE = tuple(f.name for f in CANDIDATE_REWARDS)
_REDUCE = {"max": np.maximum, "min": np.minimum, "mean": np.add}


class RunColumns:
    """Rewards, verdicts, metrics and proposals of a batch of runs (`bundles`, in order), with
    the step facts of `chat` (`ChatColumns` of the same bundles)."""

    def __init__(self, bundles: list[RunBundle], chat: ChatColumns, weights: dict[str, float]):
        self.bundles, self.chat, self.weights = bundles, chat, weights
        n_runs = len(bundles)
        experiments = [e for b in bundles for e in b.experiments]
        counts = np.fromiter((len(b.experiments) for b in bundles), np.int64, n_runs)
        starts = offsets(counts)
        scores = [candidate_scores(e.result) for e in experiments]
        matrix = np.array([[s[name] for name in _CANDIDATE] for s in scores], dtype=np.float64)
        matrix = matrix.reshape(len(experiments), len(_CANDIDATE))
        flagged = np.fromiter(
            (Flag.SUSPICIOUS in e.result.flags for e in experiments), bool, len(experiments)
        )
        self._scores, self._starts = scores, starts.tolist()

        # Trajectory components: each candidate component aggregated over the run's experiments.
        components = np.zeros((n_runs, len(COMPONENTS)))
        for k, fn in enumerate(CANDIDATE_REWARDS):
            values = matrix[:, k]
            if fn.name == "proven_improvement":  # a suspicious win is not a proven one
                values = np.where(flagged, -np.inf, values)
            components[:, k] = _per_run(values, starts, fn.aggregate)
        reviews = [
            [review_score(p, b.decisions.get(p.id, [])) for p in b.proposals] for b in bundles
        ]
        components[:, -1] = [sum(r) / len(r) if r else 0.0 for r in reviews]
        self.reward = _weighted_totals(components, weights)
        self._components = components

        # Each proposal's components: its latest backing experiment's (of its run), plus review.
        where = {(i, e.id): k for i, b in enumerate(bundles) for k, e in
                 enumerate(b.experiments, start=int(starts[i]))}  # fmt: skip
        backing = [
            next((where[i, x] for x in reversed(p.experiment_ids) if (i, x) in where), -1)
            for i, b in enumerate(bundles)
            for p in b.proposals
        ]
        self._proposal_list = [p for b in bundles for p in b.proposals]
        per_proposal = np.zeros((len(backing), len(COMPONENTS)))
        picked = np.asarray(backing, dtype=np.int64)
        per_proposal[picked >= 0, :-1] = matrix[picked[picked >= 0]]
        per_proposal[:, -1] = [r for rs in reviews for r in rs]
        self._proposal_reward = _weighted_totals(per_proposal, weights)
        self._proposal_components = per_proposal
        p_counts = np.fromiter((len(b.proposals) for b in bundles), np.int64, n_runs)
        self._proposal_starts = offsets(p_counts)
        self.suspicious = per_run_sums(flagged, starts)
        self.n_experiments = counts
        # The accuracy outcome of runs without a proven candidate (`build.best_candidate`'s pool
        # is then every experiment), and which runs have one.
        correctness = matrix[:, _CANDIDATE.index("correctness")]
        improved = np.fromiter(
            (e.result.verdict is Verdict.IMPROVED for e in experiments), bool, len(experiments)
        )
        self._failed = (per_run_sums(correctness < 0, starts) > 0).tolist()
        self._passed = (per_run_sums(correctness > 0, starts) > 0).tolist()
        self._has_candidate = (per_run_sums(improved & ~flagged, starts) > 0).tolist()
        self.verdicts = [[e.result.verdict.value for e in by_patch(b)] for b in bundles]

    def table(self, fmt: ExportFormat, kept: list[int], redactor: Redactor | None) -> pa.Table:
        """The `fmt` table of the kept runs' rows (indices into the bundles, in order), every
        string redacted when a `redactor` is given; the same table `writers.arrow_table` makes of
        `rows.run_row`'s rows."""
        chat, bundles = self.chat, self.bundles
        idx = np.asarray(kept, dtype=np.int64)
        runs = [bundles[i].run for i in kept]
        reviewed = [bundles[i].reviewed for i in kept]
        best = [self._best(i) for i in kept]
        tools = [chat.tools(i) for i in kept]
        columns: dict[str, Any] = chat.message_columns(fmt, kept)
        columns["tools_json"] = json_texts(tools, redactor)
        reward = [self.reward[i] for i in kept]
        verdicts = [self.verdicts[i] for i in kept]
        if fmt is ExportFormat.OPENAI_SFT:
            columns["metadata"] = pa.StructArray.from_arrays(
                [
                    pa.array([r.id for r in runs], pa.string()),
                    pa.array([r.task for r in runs], pa.string()),
                    pa.array(reward, pa.float64()),
                    pa.array(verdicts, pa.list_(pa.string())),
                    pa.array(reviewed, pa.bool_()),
                    pa.array([b[0] for b in best], pa.float64()),
                ],
                fields=list(ARROW_SCHEMAS[fmt].field("metadata").type),
            )
        else:
            schema = ARROW_SCHEMAS[fmt]
            component_type = schema.field("reward_components").type
            columns["session_id"] = pa.array([r.id for r in runs], pa.string())
            columns["task"] = pa.array([r.task for r in runs], pa.string())
            columns["reward"] = pa.array(reward, pa.float64())
            columns["reward_components"] = pa.StructArray.from_arrays(
                [pa.array(c) for c in self._components[idx].T], fields=list(component_type)
            )
            columns["reward_weights"] = pa.StructArray.from_arrays(
                [pa.array(np.full(len(kept), self.weights[name])) for name in COMPONENTS],
                fields=list(component_type),
            )
            steps = chat.step_metrics(kept)
            metrics = [
                [b[0] for b in best],
                [b[1] for b in best],
                [b[2] for b in best],
                [b[3] for b in best],
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
                [pa.array(v, f.type) for v, f in zip(metrics, metric_type, strict=True)],
                fields=list(metric_type),
            )
            columns["verdicts"] = pa.array(verdicts, pa.list_(pa.string()))
            columns["proposals"] = self._proposals(kept, schema.field("proposals").type)
        schema = ARROW_SCHEMAS[fmt]
        table = pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
        if redactor is None:
            return table
        return redactor.table(table, done={f"{name}_json" for name in JSON_TEXT_COLUMNS[fmt]})

    def _best(self, i: int) -> tuple[float | None, float | None, float | None, str]:
        """(best speedup, its CI low and high, accuracy outcome) of run i: `build.best_candidate`
        from the candidate scores already computed."""
        if not self._has_candidate[i]:
            if self._failed[i]:
                return None, None, None, "failed"
            return None, None, None, "passed" if self._passed[i] else "not_measured"
        a, b = self._starts[i], self._starts[i + 1]
        experiments = self.bundles[i].experiments
        scores = {e.id: s for e, s in zip(experiments, self._scores[a:b], strict=True)}
        best = best_candidate(experiments, scores)
        return (
            best["best_speedup"],
            best["best_speedup_ci_low"],
            best["best_speedup_ci_high"],
            best["accuracy_outcome"],
        )

    def _proposals(self, kept: list[int], type_: pa.ListType) -> pa.Array:
        """The kept runs' proposals with their rewards (`build.run_rewards`), a list per run."""
        lo, hi = self._proposal_starts[:-1][kept], self._proposal_starts[1:][kept]
        proposals, item = self._proposal_list, type_.value_type
        values = pa.StructArray.from_arrays(
            [
                pa.array([p.id for p in proposals], pa.string()),
                pa.array([p.patch_id for p in proposals], pa.string()),
                pa.array([p.status.value for p in proposals], pa.string()),
                pa.array(self._proposal_reward, pa.float64()),
                pa.StructArray.from_arrays(
                    [pa.array(c) for c in self._proposal_components.T],
                    fields=list(item.field("reward_components").type),
                ),
            ],
            fields=list(item),
        )
        return lists_of(values, lo, hi, type_)


def _weighted_totals(components: np.ndarray, weights: dict[str, float]) -> list[float]:
    """`rewards.weighted_total` of each row of `components` (columns in `COMPONENTS` order):
    the same float operations, in the same order, and the same rounding."""
    total = np.zeros(len(components))
    for k, name in enumerate(COMPONENTS):
        total = total + weights[name] * components[:, k]
    return [round(t, 12) for t in total.tolist()]


def _per_run(values: np.ndarray, starts: np.ndarray, how: str) -> np.ndarray:
    """`values` (one per experiment, runs delimited by `starts`) aggregated per run as
    `rewards._aggregate` does: max, min or mean; 0.0 for a run with none (or only -inf)."""
    counts = np.diff(starts)
    out = np.zeros(len(counts))
    some = counts > 0
    if not len(values) or not some.any():
        return out
    reduced = _REDUCE[how].reduceat(values, starts[:-1][some])
    if how == "mean":
        reduced = reduced / counts[some]
    out[some] = np.where(np.isneginf(reduced), 0.0, reduced)
    return out
