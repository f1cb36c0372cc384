"""The per-run columns of a batch of chat or RL rows (all but the messages), built column-wise.

`rows.row_of` makes each run's row as Python dicts (rewards, metrics, proposals) that Arrow then
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
from infra_agent.trajectories.build import RunBundle
from infra_agent.trajectories.chat_columns import ChatColumns
from infra_agent.trajectories.formats import ARROW_SCHEMAS, JSON_TEXT_COLUMNS, ExportFormat
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import (
    CANDIDATE_REWARDS,
    COMPONENTS,
    candidate_scores,
    review_score,
    weighted_total,
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
        starts = np.zeros(n_runs + 1, dtype=np.int64)
        np.cumsum(counts, out=starts[1:])
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
        total = np.zeros(n_runs)
        for k, name in enumerate(COMPONENTS):  # `weighted_total`'s sum, in the same order
            total = total + weights[name] * components[:, k]
        self.reward = [round(t, 12) for t in total.tolist()]
        self._components = components
        self._reviews = reviews
        flags = np.zeros(len(experiments) + 1, dtype=np.int64)
        np.cumsum(flagged, out=flags[1:])
        self.suspicious = flags[starts[1:]] - flags[starts[:-1]]
        self.n_experiments = counts
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
            facts = [chat.facts(i) for i in kept]
            metrics = [
                [b[0] for b in best],
                [b[1] for b in best],
                [b[2] for b in best],
                [b[3] for b in best],
                reviewed,
                self.suspicious[idx],
                [f.n_messages for f in facts],
                [f.n_calls for f in facts],
                self.n_experiments[idx],
                [f.totals["total_prompt_tokens"] for f in facts],
                [f.totals["total_completion_tokens"] for f in facts],
                [f.totals["total_cost_usd"] for f in facts],
            ]
            metric_type = schema.field("metrics").type
            columns["metrics"] = pa.StructArray.from_arrays(
                [pa.array(v, f.type) for v, f in zip(metrics, metric_type, strict=True)],
                fields=list(metric_type),
            )
            columns["verdicts"] = pa.array(verdicts, pa.list_(pa.string()))
            columns["proposals"] = pa.array(
                [self._proposals(i) for i in kept], schema.field("proposals").type
            )
        schema = ARROW_SCHEMAS[fmt]
        table = pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
        if redactor is None:
            return table
        return redactor.table(table, done={f"{name}_json" for name in JSON_TEXT_COLUMNS[fmt]})

    def _best(self, i: int) -> tuple[float | None, float | None, float | None, str]:
        """(best speedup, its CI low and high, accuracy outcome) of run i: `build.best_candidate`
        from the candidate scores already computed."""
        a, b = self._starts[i], self._starts[i + 1]
        experiments = self.bundles[i].experiments
        scores = self._scores[a:b]
        best, best_key, best_scores = None, None, None
        for e, s in zip(experiments, scores, strict=True):
            if e.result.verdict is not Verdict.IMPROVED or Flag.SUSPICIOUS in e.result.flags:
                continue
            perf = e.result.evidence.performance
            key = (s["proven_improvement"], perf.speedup if perf else 0.0)
            if best_key is None or key > best_key:
                best, best_key, best_scores = e, key, s
        pool = [best_scores] if best is not None else scores
        outcome = "not_measured"
        if any(s["correctness"] < 0 for s in pool):
            outcome = "failed"
        elif any(s["correctness"] > 0 for s in pool):
            outcome = "passed"
        perf = best.result.evidence.performance if best is not None else None
        if perf is None:
            return None, None, None, outcome
        return perf.speedup, perf.ci_low, perf.ci_high, outcome

    def _proposals(self, i: int) -> list[dict[str, Any]]:
        """Run i's proposals with their rewards (`build.run_rewards`)."""
        bundle = self.bundles[i]
        if not bundle.proposals:
            return []
        a, b = self._starts[i], self._starts[i + 1]
        by_id = {e.id: s for e, s in zip(bundle.experiments, self._scores[a:b], strict=True)}
        out = []
        for p, review in zip(bundle.proposals, self._reviews[i], strict=True):
            backing = [x for x in p.experiment_ids if x in by_id]
            base = by_id[backing[-1]] if backing else dict.fromkeys(COMPONENTS, 0.0)
            scores = base | {"review": review}
            out.append({"proposal_id": p.id, "patch_id": p.patch_id, "status": p.status.value,
                        "reward": weighted_total(scores, self.weights),
                        "reward_components": scores})  # fmt: skip
        return out


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
