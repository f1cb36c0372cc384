"""The canonical trajectory record: one run, shaped after ATIF v1.4.

ATIF (Agent Trajectory Interchange Format, harbor's RFC 0001) fixes the root (`schema_version`,
`session_id`, `agent`, `steps`, `notes`, `final_metrics`, `extra`), the step (`step_id` from 1,
`source` system|user|agent, `message`, `reasoning_content`, `tool_calls`, `observation`,
`metrics`), the tool call (`tool_call_id`, `function_name`, `arguments` as an object) and the
metrics (tokens, `cost_usd`, `logprobs`, token ids). Everything infra-agent adds lives in the
`extra` objects ATIF reserves for that, typed here:

- `Trajectory.extra` (`RunExtension`): the task and its environment fingerprint, every patch with
  its experiments' verdicts and full evidence, the proposals with their review decisions, and the
  trajectory reward with its components;
- `FinalMetrics.extra` (`Outcome`): reward, best proven speedup, accuracy outcome, verdict counts;
- `Step.extra` (`StepExtension`): the store role and seqs, errors, and the model's own text of
  tool-call arguments wherever it is not exactly the JSON of the parsed object (ATIF requires an
  object: a text that is not one keeps `{}` there and its raw text here).

Mapping from the run store: an assistant message becomes an agent step; the tool messages that
answer its calls become that step's `observation.results`; `harness` messages (notes of the
agent loop: baseline, experiment started, decisions, review, apply; never sent to the model)
become system steps. So the store's message count is
`len(steps) + sum(len(step.observation.results))`, kept as `Outcome.store_messages`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra_agent.store.records import (
    DecisionAction,
    PatchKind,
    ProposalStatus,
    RiskLevel,
    RunStatus,
    RuntimeEnvironment,
)
from infra_agent.store.verdict import Evidence, Flag, Verdict
from infra_agent.trajectories.rewards import Components, Reward

ATIF_SCHEMA_VERSION: Literal["ATIF-v1.4"] = "ATIF-v1.4"
EXTENSION_VERSION = 2
"""Version of infra-agent's typed `extra` objects; bumped on any change to them.
2: the task's environment carries the sandbox; a patch's experiments are `PatchExperiment`s; a
step keeps the raw text of every tool call's arguments that its parsed object does not spell."""

AGENT_NAME = "infra-agent"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- ATIF core -------------------------------------------------------------------------------
class Agent(_Strict):
    name: str
    version: str
    model_name: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    """`policy` (llm | search | scripted)."""


class AtifToolCall(_Strict):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    """Parsed arguments; `{}` when the model's text was not a JSON object (see StepExtension)."""


class ObservationResult(_Strict):
    source_call_id: str | None = None
    content: str | None = None


class Observation(_Strict):
    results: list[ObservationResult]


class Metrics(_Strict):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    """`tokens`: the completion tokens as text, when the endpoint returned them with logprobs."""


class ToolError(_Strict):
    source_call_id: str | None
    error: str


class RawArguments(_Strict):
    tool_call_id: str
    raw: str
    """The arguments text exactly as the model produced it."""


class StepExtension(_Strict):
    role: Literal["system", "user", "assistant", "tool", "harness"]
    """The store role of the message that opened this step."""
    name: str | None = None
    """The store's name of the message (for harness notes: baseline, experiment, decision, ...)."""
    seqs: list[int]
    """Store seqs folded into this step (the message, then its tool results)."""
    error: str | None = None
    """The message's error report (bad tool call, rate limit, timeout)."""
    tool_errors: list[ToolError] = Field(default_factory=list)
    raw_tool_arguments: list[RawArguments] = Field(default_factory=list)
    """The model's arguments text of each call where it is not exactly the JSON of `arguments`
    (not a JSON object, or written with other spacing): what a chat export shows."""
    tool_names: list[str] = Field(default_factory=list)
    """Tool names of the observation results, in order (the store's `name` of each tool message)."""


class Step(_Strict):
    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    message: str
    reasoning_content: str | None = None
    tool_calls: list[AtifToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    extra: StepExtension


# -- infra-agent extension -------------------------------------------------------------------
class TaskInfo(_Strict):
    id: str
    """Task name, e.g. 'sglang-cpu-tiny'."""
    objective: str
    """throughput | latency | accuracy | goodput | correctness."""
    prompt: str
    """The first user message: what the agent was asked to do."""
    target_fingerprints: list[str]
    """Hashes of task + baseline workspace the experiments ran against."""
    environment: RuntimeEnvironment
    """Package versions, hardware and sandbox the run recorded at its start (`recorded` False
    when it recorded none)."""
    sandboxes: list[str]
    """Sandbox backends the experiments used."""
    isolation: list[str]
    """Isolation in force in those sandboxes (union)."""
    seeds: list[int]
    """Seeds from the run config (`seed` / `seeds`)."""


class RunInfo(_Strict):
    status: RunStatus
    policy: str
    summary: str
    created_at: datetime
    updated_at: datetime
    config_json: str
    """The run's config (budget, options; no secrets) as JSON text."""


class PatchExperiment(_Strict):
    """One experiment on a patch: its verdict, full evidence and reward components."""

    experiment_id: str
    verdict: Verdict
    flags: list[Flag]
    reasons: list[str]
    sandbox: str
    started_at: datetime
    duration_s: float
    target_fingerprint: str
    evidence: Evidence
    reward_components: Components
    """This candidate's reward components (review is always 0 here)."""


class PatchOutcome(_Strict):
    patch_id: str
    kind: PatchKind | None
    """None when the patch body is missing from the store."""
    author: str
    rationale: str
    files: list[str]
    diff: str
    knobs_json: str
    """Knob name -> value as JSON text (values vary in type across patches)."""
    experiments: list[PatchExperiment]


class Decision(_Strict):
    decision_id: str
    reviewer: str
    action: DecisionAction
    patch_hash: str
    comment: str
    created_at: datetime


class ProposalOutcome(_Strict):
    proposal_id: str
    patch_id: str
    patch_hash: str
    status: ProposalStatus
    risk: RiskLevel
    risk_reasons: list[str]
    expected_gain: float | None
    rationale: str
    experiment_ids: list[str]
    applied_to: str = ""
    """Where an approved patch was applied (git branch and repo, or knobs file); '' if not."""
    decisions: list[Decision]
    reward: Reward


class RunExtension(_Strict):
    extension_version: int = EXTENSION_VERSION
    task: TaskInfo
    run: RunInfo
    patches: list[PatchOutcome]
    proposals: list[ProposalOutcome]
    reward: Reward


class VerdictCounts(_Strict):
    IMPROVED: int = 0
    NO_CHANGE: int = 0
    REGRESSED: int = 0
    INCORRECT: int = 0
    FAILED: int = 0
    REJECTED: int = 0


class Outcome(_Strict):
    reward: float
    """Trajectory reward under the export's weights (components in `RunExtension.reward`)."""
    best_speedup: float | None
    """Largest speedup among IMPROVED, non-suspicious experiments (>1 better)."""
    best_speedup_ci_low: float | None
    best_speedup_ci_high: float | None
    best_patch_id: str | None
    accuracy_outcome: Literal["passed", "failed", "not_measured"]
    """Correctness of the best candidate; without one, 'failed' if any experiment failed its
    correctness checks, else 'passed' if any passed, else 'not_measured'."""
    verdict_counts: VerdictCounts
    suspicious: int
    """Experiments flagged suspicious."""
    reviewed: bool
    """True when a person (not the auto-approve policy) decided on a proposal of this run."""
    store_messages: int
    tool_calls: int


class FinalMetrics(_Strict):
    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: float | None = None
    total_steps: int
    extra: Outcome


class Trajectory(_Strict):
    """One run as an ATIF trajectory with infra-agent's verified outcome attached."""

    schema_version: Literal["ATIF-v1.4"] = ATIF_SCHEMA_VERSION
    session_id: str
    """The run id."""
    agent: Agent
    steps: list[Step]
    notes: str | None = None
    final_metrics: FinalMetrics
    extra: RunExtension

    def verdicts(self) -> list[Verdict]:
        """Verdicts of all experiments, in patch then experiment order."""
        return [e.verdict for p in self.extra.patches for e in p.experiments]
