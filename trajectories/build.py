"""Build the canonical `Trajectory` of one run from the run store.

`load_run` reads everything a run touched (steps, experiments, patches, proposals, decisions);
`build_trajectory` turns it into a plain tree, redacts every string in it, and validates the
tree as a `Trajectory` — the schema check every export goes through.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from infra_agent import __version__
from infra_agent.experiments.verdict import Flag, Verdict
from infra_agent.store.base import BulkReads, RunStore
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    PatchRecord,
    ProposalRecord,
    RunRecord,
    StepRecord,
)
from infra_agent.trajectories.atif import AGENT_NAME, Trajectory
from infra_agent.trajectories.environment import ENVIRONMENT_KEY, recorded_environment
from infra_agent.trajectories.redact import Redactor
from infra_agent.trajectories.rewards import (
    COMPONENTS,
    RewardWeights,
    aggregate_scores,
    candidate_scores,
    correctness,
    proven_improvement,
    review_score,
    reward_dict,
)

_SOURCE = {"system": "system", "user": "user", "harness": "system", "assistant": "agent"}


@dataclass
class RunBundle:
    """Everything the store holds about one run."""

    run: RunRecord
    steps: list[StepRecord]
    experiments: list[ExperimentRecord]
    proposals: list[ProposalRecord]
    decisions: dict[str, list[DecisionRecord]] = field(default_factory=dict)
    """Proposal id -> its decisions, oldest first."""
    patches: dict[str, PatchRecord] = field(default_factory=dict)
    step_bodies: list[dict[str, Any]] | None = None
    """The steps as the store's parsed JSON bodies (`trusted.load_trusted_runs`, for the chat and
    RL rows), `steps` then left empty; None when `steps` holds the records."""

    @property
    def reviewed(self) -> bool:
        """A person (not the auto-approve policy) decided on one of the run's proposals."""
        return any(
            d.action is not DecisionAction.AUTO_APPROVE
            for ds in self.decisions.values()
            for d in ds
        )


class ReviewIndex:
    """Proposals by run and decisions by proposal, read in two queries (for all runs, or for one
    run when `run_id` is given).

    The run store indexes neither `proposals.run_id` nor `decisions.proposal_id`, so asking per
    run scans both tables each time (quadratic over a full export); exports read them once."""

    def __init__(self, store: RunStore, run_id: str | None = None) -> None:
        self.proposals: dict[str | None, list[ProposalRecord]] = defaultdict(list)
        for proposal in store.proposals(run_id=run_id):
            self.proposals[proposal.run_id].append(proposal)
        if run_id is None:
            decisions = store.decisions()
        else:
            decisions = [d for p in self.proposals[run_id] for d in store.decisions(p.id)]
        self.decisions: dict[str, list[DecisionRecord]] = defaultdict(list)
        for decision in decisions:
            self.decisions[decision.proposal_id].append(decision)


def load_run(store: RunStore, run: RunRecord, review: ReviewIndex | None = None) -> RunBundle:
    """Read one run's records. Experiments named by its proposals are included even when they
    were recorded without the run id. `review` (for many runs) saves two queries per run."""
    return load_runs(store, [run], review or ReviewIndex(store, run.id))[0]


def load_runs(
    store: RunStore, runs: list[RunRecord], review: ReviewIndex, *, patches: bool = True
) -> list[RunBundle]:
    """`load_run` of each run, in order, with a few queries for all of them when the store
    offers bulk reads (`store.base.BulkReads`). `patches=False` leaves `RunBundle.patches` empty
    (the chat and RL rows do not show patch bodies)."""
    ids = [run.id for run in runs]
    if isinstance(store, BulkReads):
        steps, experiments = store.steps_of_runs(ids), store.experiments_of_runs(ids)
    else:
        steps = {i: store.steps(i) for i in ids}
        experiments = {i: store.experiments(i) for i in ids}
    bundles = []
    for run in runs:
        proposals = list(review.proposals.get(run.id, []))
        run_experiments = list(experiments.get(run.id, []))
        add_proposal_experiments(store, proposals, run_experiments)
        bundles.append(
            RunBundle(
                run=run,
                steps=steps.get(run.id, []),
                experiments=run_experiments,
                proposals=proposals,
                decisions={p.id: list(review.decisions.get(p.id, [])) for p in proposals},
            )
        )
    if not patches:
        return bundles
    wanted = [patch_id for b in bundles for patch_id in patch_order(b)]
    if isinstance(store, BulkReads):
        found = store.patches_by_id(wanted)
    else:
        found = {}
        for patch_id in dict.fromkeys(wanted):
            patch = store.get_patch(patch_id)
            if patch is not None:
                found[patch_id] = patch
    for b in bundles:
        b.patches = {i: found[i] for i in patch_order(b) if i in found}
    return bundles


def add_proposal_experiments(
    store: RunStore, proposals: list[ProposalRecord], experiments: list[Any]
) -> None:
    """Append to `experiments` those the proposals name but the run's own list lacks (recorded
    without the run id), read from the store."""
    known = {e.id for e in experiments}
    for proposal in proposals:
        for exp_id in proposal.experiment_ids:
            if exp_id not in known:
                exp = store.get_experiment(exp_id)
                if exp is not None:
                    experiments.append(exp)
                    known.add(exp_id)


def build_trajectory(
    bundle: RunBundle, *, redactor: Redactor, weights: RewardWeights | None = None
) -> Trajectory:
    """The run as a validated, redacted `Trajectory`. Raises pydantic.ValidationError if the store
    holds something the schema cannot represent."""
    tree = trajectory_tree(bundle, weights)
    return validate_trajectory(redactor.json(tree), tree, redactor)


def validate_trajectory(redacted_json: str, tree: dict[str, Any], redactor: Redactor) -> Trajectory:
    """The `Trajectory` of `tree`, given `tree`'s JSON text after redaction. Raises
    pydantic.ValidationError if the tree does not fit the schema."""
    try:  # pydantic parses the redacted JSON text in Rust: no second Python walk over the tree
        return Trajectory.model_validate_json(redacted_json)
    except ValidationError as exc:
        if any(e["type"] != "json_invalid" for e in exc.errors()):
            raise
        return Trajectory.model_validate(redactor.tree(tree))  # a redaction broke the JSON


def trajectory_tree(bundle: RunBundle, weights: RewardWeights | None = None) -> dict[str, Any]:
    """The run's `Trajectory` as a plain JSON-like tree, neither redacted nor validated yet."""
    run = bundle.run
    steps = _steps(bundle.steps, run.model)
    results = [e.result for e in bundle.experiments]
    w = (weights or RewardWeights()).model_dump()
    rewards = run_rewards(bundle, w)
    proposals = [
        _proposal(p, bundle.decisions.get(p.id, []), reward_dict(scores, w))
        for p, scores in rewards.proposals
    ]
    reward = rewards.trajectory

    env = recorded_environment(run.config)
    config = {k: v for k, v in run.config.items() if k != ENVIRONMENT_KEY}
    isolation = sorted(
        {
            i
            for e in bundle.experiments
            if e.result.evidence.sandbox
            for i in e.result.evidence.sandbox.isolation
        }
    )
    n_calls = sum(len(s.tool_calls) for s in bundle.steps)
    tree: dict[str, Any] = {
        "session_id": run.id,
        "agent": {
            "name": AGENT_NAME,
            "version": env.packages.get("infra-agent") or str(run.config.get("agent_version", __version__)),
            "model_name": run.model,
            "extra": {"policy": run.policy},
        },
        "steps": steps,
        "notes": run.summary or None,
        "final_metrics": {
            **token_totals(bundle.steps),
            "total_steps": len(steps),
            "extra": {
                "reward": reward["total"],
                **best_candidate(bundle.experiments),
                "verdict_counts": {v.value: sum(r.verdict is v for r in results) for v in Verdict},
                "suspicious": sum(Flag.SUSPICIOUS in r.flags for r in results),
                "reviewed": bundle.reviewed,
                "store_messages": len(bundle.steps),
                "tool_calls": n_calls,
            },
        },
        "extra": {
            "task": {
                "id": run.task,
                "objective": run.objective,
                "prompt": next((s.content for s in bundle.steps if s.role == "user"), ""),
                "target_fingerprints": sorted({e.target_fingerprint for e in bundle.experiments if e.target_fingerprint}),
                "environment": env.model_dump(mode="json"),
                "sandboxes": sorted({e.sandbox for e in bundle.experiments}),
                "isolation": isolation,
                "seeds": _seeds(run.config),
            },
            "run": {
                "status": run.status.value,
                "policy": run.policy,
                "summary": run.summary,
                "created_at": run.created_at.isoformat(),
                "updated_at": run.updated_at.isoformat(),
                "config_json": json.dumps(config, sort_keys=True, default=str),
            },
            "patches": _patches(bundle),
            "proposals": proposals,
            "reward": reward,
        },
    }  # fmt: skip
    return tree


@dataclass
class RunRewards:
    """The rewards of one run, from one scoring of each experiment."""

    trajectory: dict[str, Any]
    """The trajectory reward as a `Reward` dict (see rewards.reward_dict)."""
    proposals: list[tuple[ProposalRecord, dict[str, float]]]
    """Each proposal with its components: its latest backing experiment's, plus the review."""
    scores: dict[str, dict[str, float]]
    """Experiment id -> its `rewards.candidate_scores`."""


def run_rewards(bundle: RunBundle, weights: dict[str, float]) -> RunRewards:
    """`rewards.trajectory_reward` and `rewards.proposal_reward` of the run, each experiment
    scored once."""
    scores = {e.id: candidate_scores(e.result) for e in bundle.experiments}
    candidates = [(scores[e.id], Flag.SUSPICIOUS in e.result.flags) for e in bundle.experiments]
    reviews, proposals = [], []
    for p in bundle.proposals:
        review = review_score(p, bundle.decisions.get(p.id, []))
        reviews.append(review)
        backing = [i for i in p.experiment_ids if i in scores]
        base = scores[backing[-1]] if backing else dict.fromkeys(COMPONENTS, 0.0)
        proposals.append((p, base | {"review": review}))
    return RunRewards(
        reward_dict(aggregate_scores(candidates, reviews), weights), proposals, scores
    )


def _steps(records: list[StepRecord], model: str | None) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    owner: dict[str, dict[str, Any]] = {}  # tool_call_id -> the agent step that made the call
    last_agent: dict[str, Any] | None = None
    for rec in records:
        if rec.role == "tool":
            step = owner.get(rec.tool_call_id or "") or last_agent
            if step is None:  # a tool result with no call before it: keep it, on its own
                step = _new_step(steps, rec, source="system", message="")
            step.setdefault("observation", {"results": []})["results"].append(
                {"source_call_id": rec.tool_call_id, "content": rec.content}
            )
            step["extra"]["seqs"].append(rec.seq)
            step["extra"]["tool_names"].append(rec.name or "")
            if rec.error:
                step["extra"]["tool_errors"].append(
                    {"source_call_id": rec.tool_call_id, "error": rec.error}
                )
            continue
        step = _new_step(steps, rec, source=_SOURCE[rec.role], message=rec.content)
        if rec.error:
            step["extra"]["error"] = rec.error
        if rec.role != "assistant":
            continue
        last_agent = step
        step["model_name"] = model
        step["reasoning_content"] = rec.reasoning_content
        if rec.tool_calls:
            step["tool_calls"] = []
            for call in rec.tool_calls:
                args = _parse_object(call.arguments)
                if args is None:
                    step["extra"]["invalid_tool_arguments"].append(
                        {"tool_call_id": call.id, "raw": call.arguments}
                    )
                step["tool_calls"].append(
                    {"tool_call_id": call.id, "function_name": call.name, "arguments": args or {}}
                )
                owner[call.id] = step
        metrics = _metrics(rec)
        if metrics is not None:
            step["metrics"] = metrics
    return steps


def _new_step(
    steps: list[dict[str, Any]], rec: StepRecord, *, source: str, message: str
) -> dict[str, Any]:
    step: dict[str, Any] = {
        "step_id": len(steps) + 1,
        "timestamp": rec.created_at.isoformat(),
        "source": source,
        "message": message,
        "extra": {"role": rec.role, "name": rec.name, "seqs": [rec.seq], "tool_errors": [], "invalid_tool_arguments": [], "tool_names": []},
    }  # fmt: skip
    steps.append(step)
    return step


def _parse_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _metrics(rec: StepRecord) -> dict[str, Any] | None:
    if (
        rec.prompt_tokens is None
        and rec.completion_tokens is None
        and rec.cost_usd is None
        and not rec.logprobs
    ):
        return None
    metrics: dict[str, Any] = {
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "cost_usd": rec.cost_usd,
        "extra": {},
    }
    entries = rec.logprobs or []
    if entries and all(isinstance(e.get("logprob"), int | float) for e in entries):
        metrics["logprobs"] = [float(e["logprob"]) for e in entries]
        ids = [e.get("token_id", e.get("id")) for e in entries]
        if all(isinstance(i, int) for i in ids):
            metrics["completion_token_ids"] = ids
        if all(isinstance(e.get("token"), str) for e in entries):
            metrics["extra"]["tokens"] = [e["token"] for e in entries]
    return metrics


def token_totals(steps: Sequence[StepRecord] | Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Tokens and cost summed over the steps (records, or their bodies as `rows` reads them):
    `total_prompt_tokens`, `total_completion_tokens`, `total_cost_usd`; None where no step
    has a value."""

    def total(key: str) -> Any:
        values = (s[key] if isinstance(s, dict) else getattr(s, key) for s in steps)
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    return {
        f"total_{key}": total(key) for key in ("prompt_tokens", "completion_tokens", "cost_usd")
    }


def _seeds(config: dict[str, Any]) -> list[int]:
    seeds = config.get("seeds", [])
    seeds = list(seeds) if isinstance(seeds, list | tuple) else []
    if isinstance(config.get("seed"), int):
        seeds.insert(0, config["seed"])
    return [s for s in seeds if isinstance(s, int) and not isinstance(s, bool)]


def best_candidate(
    experiments: list[ExperimentRecord], scores: dict[str, dict[str, float]] | None = None
) -> dict[str, Any]:
    """The best proven candidate (IMPROVED, not suspicious) and the run's accuracy outcome.
    `scores`: experiment id -> `candidate_scores` when already computed (`RunRewards.scores`)."""
    candidates = [
        e
        for e in experiments
        if e.result.verdict is Verdict.IMPROVED and Flag.SUSPICIOUS not in e.result.flags
    ]

    def proven(e: ExperimentRecord) -> float:
        return scores[e.id]["proven_improvement"] if scores else proven_improvement(e.result)

    def key(e: ExperimentRecord) -> tuple[float, float]:
        perf = e.result.evidence.performance
        return (proven(e), perf.speedup if perf else 0.0)

    best = max(candidates, key=key, default=None)
    perf = best.result.evidence.performance if best else None
    pool = [best] if best else experiments
    if scores:
        accuracy = _accuracy([scores[e.id]["correctness"] for e in pool])
    else:
        accuracy = _accuracy([correctness(e.result) for e in pool])
    return {
        "best_speedup": perf.speedup if perf else None,
        "best_speedup_ci_low": perf.ci_low if perf else None,
        "best_speedup_ci_high": perf.ci_high if perf else None,
        "best_patch_id": best.patch_id if best else None,
        "accuracy_outcome": accuracy,
    }


def _accuracy(scores: list[float]) -> str:
    """'failed' when a correctness score is negative, 'passed' when one is positive."""
    if any(s < 0 for s in scores):
        return "failed"
    return "passed" if any(s > 0 for s in scores) else "not_measured"


def patch_order(bundle: RunBundle) -> list[str]:
    """Patch ids of the run in order of first appearance (experiments, then proposals)."""
    ids = [e.patch_id for e in bundle.experiments] + [p.patch_id for p in bundle.proposals]
    return list(dict.fromkeys(ids))


def _patches(bundle: RunBundle) -> list[dict[str, Any]]:
    out = []
    for patch_id in patch_order(bundle):
        patch = bundle.patches.get(patch_id)
        out.append(
            {
                "patch_id": patch_id,
                "kind": patch.kind.value if patch else None,
                "author": patch.author if patch else "",
                "rationale": patch.rationale if patch else "",
                "files": list(patch.files) if patch else [],
                "diff": patch.diff if patch else "",
                "knobs_json": json.dumps(patch.knobs if patch else {}, sort_keys=True, default=str),
                "experiments": [
                    _experiment(e) for e in bundle.experiments if e.patch_id == patch_id
                ],
            }
        )
    return out


def _experiment(e: ExperimentRecord) -> dict[str, Any]:
    return {
        "experiment_id": e.id,
        "verdict": e.result.verdict.value,
        "flags": [f.value for f in e.result.flags],
        "reasons": list(e.result.reasons),
        "sandbox": e.sandbox,
        "started_at": e.started_at.isoformat(),
        "duration_s": e.duration_s,
        "target_fingerprint": e.target_fingerprint,
        "evidence": e.result.evidence.model_dump(mode="json"),
        "reward_components": candidate_scores(e.result),
    }


def _proposal(
    p: ProposalRecord, decisions: list[DecisionRecord], reward: dict[str, Any]
) -> dict[str, Any]:
    return {
        "proposal_id": p.id,
        "patch_id": p.patch_id,
        "patch_hash": p.patch_hash,
        "status": p.status.value,
        "risk": p.risk.value,
        "risk_reasons": list(p.risk_reasons),
        "expected_gain": p.expected_gain,
        "rationale": p.rationale,
        "experiment_ids": list(p.experiment_ids),
        "applied_to": p.applied_to,
        "decisions": [
            {
                "decision_id": d.id,
                "reviewer": d.reviewer,
                "action": d.action.value,
                "patch_hash": d.patch_hash,
                "comment": d.comment,
                "created_at": d.created_at.isoformat(),
            }
            for d in decisions
        ],
        "reward": reward,
    }
