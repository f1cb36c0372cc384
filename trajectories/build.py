"""Build the canonical `Trajectory` of one run from the run store.

`load_runs` reads everything a run touched (steps, experiments, patches, proposals, decisions) as
the store's validated records; `build_trajectory` turns them into the typed ATIF record, rewards
and verified outcome included. Every export format is a function of that record (`formats`).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from infra_agent import __version__
from infra_agent.store.base import RunStore
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    PatchRecord,
    ProposalRecord,
    RunRecord,
    RuntimeEnvironment,
    StepRecord,
)
from infra_agent.store.verdict import Flag
from infra_agent.trajectories.atif import (
    AGENT_NAME,
    Agent,
    AtifToolCall,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Outcome,
    RawArguments,
    RunExtension,
    RunInfo,
    Step,
    StepExtension,
    TaskInfo,
    ToolError,
    Trajectory,
    VerdictCounts,
)
from infra_agent.trajectories.outcomes import best_candidate, patch_outcome, proposal_outcome
from infra_agent.trajectories.rewards import (
    Components,
    RewardWeights,
    aggregate_scores,
    candidate_scores,
    combine,
    review_score,
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
    run when `run_id` is given): asking per run would scan both tables once per run."""

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
    """Read one run's records (`review`, for many runs, saves two queries per run)."""
    return load_runs(store, [run], review or ReviewIndex(store, run.id))[0]


def load_runs(store: RunStore, runs: Sequence[RunRecord], review: ReviewIndex) -> list[RunBundle]:
    """The records of each run, in order. Experiments named by a run's proposals are included
    even when they were recorded without the run id."""
    bundles = []
    for run in runs:
        proposals = list(review.proposals.get(run.id, []))
        experiments = store.experiments(run.id)
        known = {e.id for e in experiments}
        for exp_id in (i for p in proposals for i in p.experiment_ids if i not in known):
            exp = store.get_experiment(exp_id)
            if exp is not None:
                experiments.append(exp)
                known.add(exp_id)
        bundle = RunBundle(
            run=run,
            steps=store.steps(run.id),
            experiments=experiments,
            proposals=proposals,
            decisions={p.id: list(review.decisions.get(p.id, [])) for p in proposals},
        )
        for patch_id in patch_order(bundle):
            patch = store.get_patch(patch_id)
            if patch is not None:
                bundle.patches[patch_id] = patch
        bundles.append(bundle)
    return bundles


def patch_order(bundle: RunBundle) -> list[str]:
    """Patch ids of the run in order of first appearance (experiments, then proposals)."""
    ids = [e.patch_id for e in bundle.experiments] + [p.patch_id for p in bundle.proposals]
    return list(dict.fromkeys(ids))


def build_trajectory(bundle: RunBundle, weights: RewardWeights | None = None) -> Trajectory:
    """The run as its canonical `Trajectory` (validated as it is built; not redacted: exports
    redact the rows they write)."""
    run, weights = bundle.run, weights or RewardWeights()
    steps = _steps(bundle.steps, run.model)
    scores = {e.id: candidate_scores(e.result) for e in bundle.experiments}
    reviews = [review_score(p, bundle.decisions.get(p.id, [])) for p in bundle.proposals]
    flagged = [(scores[e.id], Flag.SUSPICIOUS in e.result.flags) for e in bundle.experiments]
    reward = combine(Components(**aggregate_scores(flagged, reviews)), weights)
    results = [e.result for e in bundle.experiments]
    prompt = [s.prompt_tokens for s in bundle.steps if s.prompt_tokens is not None]
    completion = [s.completion_tokens for s in bundle.steps if s.completion_tokens is not None]
    cached = [s.cached_prompt_tokens for s in bundle.steps if s.cached_prompt_tokens is not None]
    cost = [s.cost_usd for s in bundle.steps if s.cost_usd is not None]
    environment = run.environment or RuntimeEnvironment(recorded=False)
    isolation = {
        i for r in results if r.evidence.sandbox is not None for i in r.evidence.sandbox.isolation
    }
    return Trajectory(
        session_id=run.id,
        agent=Agent(
            name=AGENT_NAME,
            version=environment.packages.get("infra-agent")
            or str(run.config.get("agent_version", __version__)),
            model_name=run.model,
            extra={"policy": run.policy},
        ),
        steps=steps,
        notes=run.summary or None,
        final_metrics=FinalMetrics(
            total_prompt_tokens=sum(prompt) if prompt else None,
            total_completion_tokens=sum(completion) if completion else None,
            total_cached_tokens=sum(cached) if cached else None,
            total_cost_usd=sum(cost) if cost else None,
            total_steps=len(steps),
            extra=Outcome(
                reward=reward.total,
                **best_candidate(bundle.experiments),
                verdict_counts=VerdictCounts(**Counter(r.verdict.value for r in results)),
                suspicious=sum(Flag.SUSPICIOUS in r.flags for r in results),
                reviewed=bundle.reviewed,
                store_messages=len(bundle.steps),
                tool_calls=sum(len(s.tool_calls) for s in bundle.steps),
            ),
        ),
        extra=RunExtension(
            task=TaskInfo(
                id=run.task,
                objective=run.objective,
                prompt=next((s.content for s in bundle.steps if s.role == "user"), ""),
                target_fingerprints=sorted(
                    {e.target_fingerprint for e in bundle.experiments if e.target_fingerprint}
                ),
                environment=environment,
                sandboxes=sorted({e.sandbox for e in bundle.experiments}),
                isolation=sorted(isolation),
                seeds=_seeds(run.config),
            ),
            run=RunInfo(
                status=run.status,
                policy=run.policy,
                summary=run.summary,
                created_at=run.created_at,
                updated_at=run.updated_at,
                config_json=json.dumps(run.config, sort_keys=True, default=str),
            ),
            patches=[patch_outcome(bundle, patch_id, scores) for patch_id in patch_order(bundle)],
            proposals=[
                proposal_outcome(bundle, p, review, scores, weights)
                for p, review in zip(bundle.proposals, reviews, strict=True)
            ],  # fmt: skip
            reward=reward,
        ),
    )


def _steps(records: list[StepRecord], model: str | None) -> list[Step]:
    """One ATIF step per message, but tool results: each joins the agent step that made its call
    (the latest agent step when the call is unknown; a step of its own when there is none)."""
    steps: list[Step] = []
    owner: dict[str, Step] = {}  # tool_call_id -> the agent step that made the call
    last_agent: Step | None = None
    for rec in records:
        if rec.role == "tool":
            step = owner.get(rec.tool_call_id or "") or last_agent
            if step is None:  # a tool result with no call before it: keep it, on its own
                step = _new_step(steps, rec, source="system", message="")
            if step.observation is None:
                step.observation = Observation(results=[])
            step.observation.results.append(
                ObservationResult(source_call_id=rec.tool_call_id, content=rec.content)
            )
            step.extra.seqs.append(rec.seq)
            step.extra.tool_names.append(rec.name or "")
            if rec.error:
                step.extra.tool_errors.append(
                    ToolError(source_call_id=rec.tool_call_id, error=rec.error)
                )
            continue
        step = _new_step(steps, rec, source=_SOURCE[rec.role], message=rec.content)
        step.extra.error = rec.error or None
        if rec.role != "assistant":
            continue
        last_agent = step
        step.model_name, step.reasoning_content = model, rec.reasoning_content
        if rec.tool_calls:
            step.tool_calls = []
            for call in rec.tool_calls:
                args = _parse_object(call.arguments)
                spelled = json.dumps(args, ensure_ascii=False) if args is not None else None
                if call.arguments.strip() and call.arguments != spelled:
                    step.extra.raw_tool_arguments.append(
                        RawArguments(tool_call_id=call.id, raw=call.arguments)
                    )
                step.tool_calls.append(AtifToolCall(
                    tool_call_id=call.id, function_name=call.name, arguments=args or {}
                ))  # fmt: skip
                owner[call.id] = step
        step.metrics = _metrics(rec)
    return steps


def _new_step(steps: list[Step], rec: StepRecord, *, source: str, message: str) -> Step:
    step = Step(
        step_id=len(steps) + 1,
        timestamp=rec.created_at.isoformat(),
        source=source,  # type: ignore[arg-type]
        message=message,
        extra=StepExtension(role=rec.role, name=rec.name, seqs=[rec.seq]),
    )
    steps.append(step)
    return step


def _parse_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _metrics(rec: StepRecord) -> Metrics | None:
    if (
        rec.prompt_tokens is None
        and rec.completion_tokens is None
        and rec.cost_usd is None
        and not rec.logprobs
    ):
        return None
    metrics = Metrics(
        prompt_tokens=rec.prompt_tokens,
        completion_tokens=rec.completion_tokens,
        cost_usd=rec.cost_usd,
        cached_tokens=rec.cached_prompt_tokens,  # ATIF's own field
    )
    if rec.reasoning_tokens is not None:  # ATIF has none: the step's extra
        metrics.extra["reasoning_tokens"] = rec.reasoning_tokens
    entries = rec.logprobs or []
    if entries and all(isinstance(e.get("logprob"), int | float) for e in entries):
        metrics.logprobs = [float(e["logprob"]) for e in entries]
        ids = [e.get("token_id", e.get("id")) for e in entries]
        if all(isinstance(i, int) for i in ids):
            metrics.completion_token_ids = [i for i in ids if isinstance(i, int)]
        if all(isinstance(e.get("token"), str) for e in entries):
            metrics.extra["tokens"] = [e["token"] for e in entries]
    return metrics


def _seeds(config: dict[str, Any]) -> list[int]:
    seeds = config.get("seeds", [])
    seeds = list(seeds) if isinstance(seeds, list | tuple) else []
    if isinstance(config.get("seed"), int):
        seeds.insert(0, config["seed"])
    return [s for s in seeds if isinstance(s, int) and not isinstance(s, bool)]
