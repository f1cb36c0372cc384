"""The agent's state: what the graph checkpoints after every step.

Everything a resumed run needs is here or in the run store; nothing lives only in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, Field

from infra_agent.store.records import (
    ExperimentRecord,
    PatchKind,
    PatchRecord,
    ProposalStatus,
    ToolCall,
)
from infra_agent.store.verdict import Flag, Verdict


class Message(BaseModel):
    """One chat message of the agent's conversation (OpenAI chat format, typed)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    reasoning_content: str | None = None
    """The model's reasoning (GLM's `reasoning_content`), kept unmodified: dialects that return
    reasoning (glm) send it back with later requests."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None

    def to_openai(self, *, reasoning: bool = False) -> dict[str, Any]:
        """The message as the chat-completions API takes it; with `reasoning`, an assistant
        message carries its `reasoning_content` (when it has one)."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if reasoning and self.role == "assistant" and self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
            out["name"] = self.name
        return out


BROKEN = "constraint broken: "
"""How a verdict's reason names a constraint shown broken (`judgement.constraints`)."""


class ExperimentOutcome(BaseModel):
    """A finished experiment, as the policies and the live view see it."""

    experiment_id: str
    patch_id: str
    patch_summary: str
    """The knob assignment or the files a diff touches, in a few words."""
    knobs: dict[str, Any] = Field(default_factory=dict)
    """The patch's knob assignment (empty for a diff)."""
    verdict: Verdict
    flags: list[Flag] = Field(default_factory=list)
    speedup: float | None = None
    """Oriented so > 1 is better; None when no performance stage ran."""
    ci_low: float | None = None
    ci_high: float | None = None
    duration_s: float = 0.0
    reused: bool = False
    """True when the same patch had already been measured in this run and was not re-run."""
    broken_constraint: str | None = None
    """The constraint metric shown broken (the verdict's REGRESSED is then its doing, whatever
    the gain's interval), else None."""

    @classmethod
    def of(
        cls, record: ExperimentRecord, patch: PatchRecord | None, *, reused: bool
    ) -> ExperimentOutcome:
        """The outcome of a stored experiment on `patch` (None when its body is missing)."""
        perf = record.result.evidence.performance
        knobs = dict(patch.knobs) if patch is not None else {}
        if patch is not None and patch.kind is PatchKind.DIFF:
            summary = "diff: " + (", ".join(patch.files) or "?")
        else:
            summary = ", ".join(f"{k}={v}" for k, v in knobs.items()) or "defaults"
        return cls(
            experiment_id=record.id, patch_id=record.patch_id, patch_summary=summary, knobs=knobs,
            verdict=record.result.verdict, flags=list(record.result.flags),
            speedup=perf.speedup if perf else None, ci_low=perf.ci_low if perf else None,
            ci_high=perf.ci_high if perf else None, duration_s=record.duration_s, reused=reused,
            broken_constraint=next((r.removeprefix(BROKEN).split()[0] for r in record.result.reasons
                                    if r.startswith(BROKEN)), None),
        )  # fmt: skip


class Budget(BaseModel):
    """Limits of one run; the run stops (and submits what it proved) at the first one reached."""

    experiments: int = 8
    """Experiments (verifications of a patch against baseline)."""
    wall_s: float = 3600.0
    """Wall time spent in the graph, seconds (summed over resumes)."""
    tokens: int = 600_000
    """Prompt + completion tokens of the model. Every request carries the conversation, up to
    the 60,000-character context (`max_context_chars`, about 15k tokens): 600k lets the 40
    replies happen. At 200k, 5 of 15 relay attempts (2026-12-05) ran out of tokens by their
    16th reply with experiments and replies to spare."""
    cost_usd: float = 5.0
    """Model cost in USD (from the profile's prices)."""
    turns: int = 40
    """Model turns (replies)."""
    looks: int = 16
    """Looks: runs of the serving instruments on a (patched) server (`tools.looks`). Spent, they
    are refused; the run goes on (0 where the run offers none)."""

    def render(self) -> str:
        cost = f"${self.cost_usd:.2f} of model cost" if self.cost_usd else "no cost limit"
        return (
            f"{self.experiments} experiments, {self.turns} replies, {self.tokens:,} tokens, "
            f"{cost}, {self.wall_s:.0f} s"
        )


class Usage(BaseModel):
    """What the run has spent so far."""

    experiments: int = 0
    wall_s: float = 0.0
    tokens: int = 0
    cost_usd: float = 0.0
    turns: int = 0
    looks: int = 0

    def exhausted(self, budget: Budget) -> str | None:
        """The first limit reached, in words, or None."""
        if self.experiments >= budget.experiments:
            return f"experiment budget used ({self.experiments}/{budget.experiments})"
        if self.wall_s >= budget.wall_s:
            return f"wall-time budget used ({self.wall_s:.0f}/{budget.wall_s:.0f} s)"
        if self.tokens >= budget.tokens:
            return f"token budget used ({self.tokens}/{budget.tokens})"
        if budget.cost_usd and self.cost_usd >= budget.cost_usd:
            return f"cost budget used (${self.cost_usd:.2f}/${budget.cost_usd:.2f})"
        if self.turns >= budget.turns:
            return f"turn budget used ({self.turns}/{budget.turns})"
        return None

    def budget_line(self, budget: Budget) -> str:
        """Every budget, used of its limit, and a warning for each past 75% or 90% of its limit
        (what each reply's answers end with)."""
        b = budget
        rows = [  # name, used, limit, used of limit in words, what is left in words
            ("replies", self.turns, b.turns, f"{self.turns}/{b.turns}", f"{b.turns - self.turns}"),
            ("tokens", self.tokens, b.tokens, f"{self.tokens:,}/{b.tokens:,}", f"{b.tokens - self.tokens:,}"),
            ("experiments", self.experiments, b.experiments, f"{self.experiments}/{b.experiments}", f"{b.experiments - self.experiments}"),
            ("cost", self.cost_usd, b.cost_usd, f"${self.cost_usd:.2f}/${b.cost_usd:.2f}", f"${b.cost_usd - self.cost_usd:.2f}"),
            ("time", self.wall_s, b.wall_s, f"{self.wall_s:.0f}/{b.wall_s:.0f} s", f"{b.wall_s - self.wall_s:.0f} s"),
        ]  # fmt: skip
        if not b.cost_usd:  # 0: no cost limit
            rows[3] = ("cost", 0.0, 0.0, f"${self.cost_usd:.2f} (no limit)", "")
        if b.looks:  # a budget of its own: spent, looks are refused and the run goes on
            rows.append(("looks", self.looks, b.looks, f"{self.looks}/{b.looks}", f"{b.looks - self.looks}"))  # fmt: skip
        line = "[budget used: " + ", ".join(f"{r[0]} {r[3]}" for r in rows) + "]"
        warnings = []
        for name, used, limit, _, left in rows:
            share = used / limit if limit > 0 else 0.0
            past = next((w for w in WARN_AT if share >= w), None)
            if past is not None:
                warnings.append(f"{name} {share:.0%} used (past {past:.0%}; {left if share < 1 else 'none'} left)")  # fmt: skip
        if warnings:
            stops = any(not w.startswith("looks ") for w in warnings)
            line += (
                f"\n[budget warning: {'; '.join(warnings)}."
                + (" The run stops at the first budget used up: plan to finish before then." if stops else "")
                + (" Looks spent are refused; the run goes on." if warnings[-1].startswith("looks ") else "")
                + "]"
            )  # fmt: skip
        return line


WARN_AT = (0.9, 0.75)
"""Shares of a budget past which the budget line warns (highest first)."""


Phase = Literal[
    "baseline", "propose", "tools", "experiment", "reflect", "submit", "review", "apply", "done"
]


@dataclass
class AgentState:
    """The graph's state, checkpointed after every node (thread id = run id)."""

    run_id: str = ""
    """The run's id in the run store; also the checkpoint thread id."""
    phase: Phase = "baseline"
    """The node that ran last (for the live view and `runs show`)."""
    messages: list[Message] = field(default_factory=list)
    """The conversation with the model (system prompt, task, replies, tool results)."""
    pending: list[ToolCall] = field(default_factory=list)
    """Tool calls of the last reply not yet answered, in order."""
    patches: list[str] = field(default_factory=list)
    """Ids of the patches proposed in this run."""
    experiments: list[ExperimentOutcome] = field(default_factory=list)
    """Finished experiments, in order."""
    usage: Usage = field(default_factory=Usage)
    """Budget spent so far."""
    invalid_replies: int = 0
    """Consecutive model replies that were not a valid tool call (reset by a valid one)."""
    model_failures: int = 0
    """Consecutive model requests that failed after retries (transport, rate limit, timeout)."""
    stop_reason: str | None = None
    """Why the search stopped (budget, the model called finish, no more candidates)."""
    last_turn: bool = False
    """The budget ran out and the policy was given its one last reply (only `finish` offered) to
    see the final results and write its summary."""
    finish_summary: str = ""
    """The policy's own summary when it called finish."""
    proposals: list[str] = field(default_factory=list)
    """Ids of the proposals this run sent to the review queue."""
    review: dict[str, ProposalStatus] = field(default_factory=dict)
    """Proposal id -> its status after review."""
    revisions: int = 0
    """How many times a reviewer sent the run back with requested changes."""
    applied: dict[str, str] = field(default_factory=dict)
    """Proposal id -> where its patch was applied."""
