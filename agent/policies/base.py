"""The policy contract: given the state so far, produce the next assistant turn; and `PolicySpec`,
how a policy registers (`agent/policies/__init__.py`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from infra_agent.agent.state import AgentState, Message
from infra_agent.config import LLMSettings
from infra_agent.errors import UserError

if TYPE_CHECKING:  # the run configuration names a registered policy
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.tasks.manifest import Task


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
    """The registered name (`PolicySpec.name`)."""
    model: str | None
    """Model name for the run record (None without a model)."""

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        """The next assistant message (normally with tool calls) given the conversation so far."""
        ...


@dataclass(frozen=True)
class PolicySpec:
    """A policy as the CLI, the configuration and the runner see it."""

    name: str
    """What `--policy` and `RunConfig.policy` call it."""
    check: Callable[[LLMSettings, Path | None], str]
    """Whether it can drive a run here, given the LLM settings and `--script`: the sentence the
    CLI shows, or UserError saying what is missing."""
    build: Callable[[RunConfig, LLMSettings, Task], Policy]
    """The policy object for a run (built when the run first asks it for a turn)."""


def no_script(script: Path | None) -> None:
    """`--script` belongs to the scripted policy: refuse it for another."""
    if script is not None:
        raise UserError("--script is only used with --policy scripted")
