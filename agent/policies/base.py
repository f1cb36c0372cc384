"""The policy contract: given the state so far, produce the next assistant turn."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from infra_agent.agent.state import AgentState, Message


class ModelError(BaseModel):
    """One failed request to the model (kept even when a retry succeeded)."""

    kind: str
    """'rate_limit' | 'server_error' | 'timeout' | 'connection' | 'bad_request' | 'other'"""
    message: str
    attempt: int
    """1-based attempt number of the request."""


class ModelTurn(BaseModel):
    """One assistant reply, with what it cost and what went wrong getting it."""

    message: Message | None = None
    """None when every attempt failed."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    logprobs: list[dict[str, Any]] | None = None
    """Per-token {token, logprob} of the reply when the endpoint returned them."""
    errors: list[ModelError] = Field(default_factory=list)
    """Failed attempts (rate limits, timeouts, server errors) before the reply, or all of them."""
    streamed: bool = False
    """The reply arrived as a stream of chunks."""


class Policy(Protocol):
    name: str
    """'llm' | 'search' | 'scripted'"""
    model: str | None
    """Model name for the run record (None for search)."""

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        """The next assistant message (normally with tool calls) given the conversation so far."""
        ...
