"""Typed records kept in the run store (versioned through `STORE_SCHEMA_VERSION`), with the enums
of their closed sets. The experiment's verdict and evidence are in `store.verdict`.

A run is a sequence of steps (model messages and tool results); experiments, proposals and
review decisions hang off it. Records cross modules as these types, never as free-form dicts.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, Field

from infra_agent.store.verdict import ExperimentResult

STORE_SCHEMA_VERSION = 3
"""3: records as JSON bodies only. Version 2 kept some fields again as export columns (and a
`step_calls` table); a version-3 opener ignores them, and bumps the version so that the older
infra-agent that read them refuses the file instead of missing the newer rows."""


def now() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class RunStatus(str, Enum):
    RUNNING = "running"
    WAITING_REVIEW = "waiting_review"
    INTERRUPTED = "interrupted"
    FINISHED = "finished"
    FAILED = "failed"


class Hardware(BaseModel):
    cpu: str | None = None
    """CPU model name."""
    cpu_count: int | None = None
    """Logical CPUs visible to the process."""
    memory_gib: float | None = None
    """Total physical memory, GiB."""
    gpus: list[str] = Field(default_factory=list)
    """GPU names as `nvidia-smi -L` reports them (empty when none or unknown)."""


class SandboxInfo(BaseModel):
    backend: str
    """The sandbox backend the run's experiments use ('local', 'docker')."""
    problem: str | None = None
    """Why the backend cannot isolate candidates on this machine (None: it can)."""


class RuntimeEnvironment(BaseModel):
    """Where a run executed, captured when it started (`sandboxes.host.capture_environment`)."""

    recorded: bool = True
    """False for a run that stored no environment (then the other fields are empty)."""
    python: str | None = None
    platform: str | None = None
    packages: dict[str, str] = Field(default_factory=dict)
    """Distribution name -> version, for the packages that decide performance."""
    hardware: Hardware = Field(default_factory=Hardware)
    sandbox: SandboxInfo | None = None


class RunRecord(BaseModel):
    id: str = Field(default_factory=lambda: new_id("run"))
    task: str
    objective: str
    """throughput | latency | accuracy | goodput"""
    policy: str
    """llm | search | scripted"""
    status: RunStatus = RunStatus.RUNNING
    model: str | None = None
    """Model name for the llm/scripted policy."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Budget and options the run was started with (no secrets)."""
    summary: str = ""
    """Final outcome in a sentence."""
    environment: RuntimeEnvironment | None = None
    """Package versions, hardware and sandbox, captured at run start (None: not recorded)."""
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)


class ToolCall(BaseModel):
    id: str
    name: str
    arguments: str
    """JSON text exactly as the model produced it (may be invalid JSON)."""


class StepRecord(BaseModel):
    """One message of the agent's conversation, in order."""

    run_id: str
    seq: int = -1
    """Position in the run; assigned by the store."""
    role: Literal["system", "user", "assistant", "tool", "harness"]
    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    """For role='tool': the call this answers."""
    name: str | None = None
    """For role='tool': the tool's name."""
    error: str | None = None
    """Set when the message is an error report (bad tool call, rate limit, timeout)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    """Generated tokens, reasoning included."""
    cached_prompt_tokens: int | None = None
    """Prompt tokens served from the endpoint's prompt cache (priced at the cached-input price);
    None when the endpoint did not report them."""
    reasoning_tokens: int | None = None
    """Completion tokens spent on reasoning; None when the endpoint did not report them."""
    cost_usd: float | None = None
    logprobs: list[dict[str, Any]] | None = None
    """Per-token logprobs when the endpoint returned them."""
    created_at: datetime = Field(default_factory=now)


class PatchKind(str, Enum):
    DIFF = "diff"
    KNOBS = "knobs"


class PatchRecord(BaseModel):
    id: str
    """Content hash of the patch (see tasks.patch.Patch.hash)."""
    kind: PatchKind
    diff: str = ""
    knobs: dict[str, Any] = Field(default_factory=dict)
    files: list[str] = Field(default_factory=list)
    author: str = "human"
    """Who proposed it: 'human', 'search', a model name."""
    rationale: str = ""
    created_at: datetime = Field(default_factory=now)


class ExperimentRecord(BaseModel):
    id: str = Field(default_factory=lambda: new_id("exp"))
    run_id: str | None = None
    task: str
    patch_id: str
    sandbox: str = "local"
    result: ExperimentResult
    started_at: datetime = Field(default_factory=now)
    duration_s: float = 0.0
    target_fingerprint: str = ""
    """Hash of the task + baseline workspace the experiment ran against (staleness check)."""

    def report(self) -> dict[str, Any]:
        """What `infra-agent experiment --json` prints: the verdict, its reasons and flags, the
        decisive evidence at the top (correctness, the performance summary without samples, the
        sandbox, stage durations) and the whole evidence under `evidence`."""
        result, evidence = self.result, self.result.evidence.model_dump(mode="json")
        perf = self.result.evidence.performance
        return {
            "experiment_id": self.id,
            "task": self.task,
            "patch_id": self.patch_id,
            "verdict": result.verdict.value,
            "reasons": list(result.reasons),
            "flags": [flag.value for flag in result.flags],
            "correctness": evidence["correctness"],
            "performance": None if perf is None else perf.summary(),
            "sandbox": evidence["sandbox"],
            "durations_s": evidence["durations_s"],
            "evidence": evidence,
        }


class ProposalStatus(str, Enum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    CHANGES_REQUESTED = "changes_requested"
    APPLIED = "applied"
    SUPERSEDED = "superseded"


class RiskLevel(str, Enum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    FORBIDDEN = "forbidden"


class ProposalRecord(BaseModel):
    id: str = Field(default_factory=lambda: new_id("prop"))
    run_id: str | None = None
    task: str
    patch_id: str
    patch_hash: str
    """The patch content hash the evidence was measured on; decisions bind to it."""
    experiment_ids: list[str] = Field(default_factory=list)
    status: ProposalStatus = ProposalStatus.PENDING
    risk: RiskLevel = RiskLevel.MEDIUM
    risk_reasons: list[str] = Field(default_factory=list)
    expected_gain: float | None = None
    """Measured speedup (or accuracy gain) of the backing experiment."""
    rationale: str = ""
    target_fingerprint: str = ""
    task_root: str = ""
    """Folder of the task the evidence was measured on (to re-check the fingerprint)."""
    resumption: str = ""
    """What happened to the waiting agent run after the decision: '', 'resumed', 'pending: ...',
    'failed: ...' (set by the review queue)."""
    applied_to: str = ""
    """Where an approved patch was applied (git branch and repo, or the knobs file)."""
    created_at: datetime = Field(default_factory=now)
    updated_at: datetime = Field(default_factory=now)


class DecisionAction(str, Enum):
    APPROVE = "approve"
    REJECT = "reject"
    REQUEST_CHANGES = "request_changes"
    REVERIFY = "reverify"
    AUTO_APPROVE = "auto_approve"
    APPLY = "apply"


class DecisionRecord(BaseModel):
    """An append-only audit entry: who decided what on which exact patch."""

    id: str = Field(default_factory=lambda: new_id("dec"))
    proposal_id: str
    reviewer: str
    action: DecisionAction
    patch_hash: str
    comment: str = ""
    created_at: datetime = Field(default_factory=now)


class FeedbackRecord(BaseModel):
    """A stored instrument result (accuracy, timeline, bench, gil, health)."""

    id: str = Field(default_factory=lambda: new_id("fb"))
    run_id: str | None = None
    instrument: str
    record: dict[str, Any]
    """The instrument's typed record, dumped to JSON."""
    rendering: str
    """The short text the model saw."""
    created_at: datetime = Field(default_factory=now)
