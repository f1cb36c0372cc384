"""The `llm` policy: a chat model with tool calling over an OpenAI-compatible endpoint.

The model client (`agent.model.client.ChatClient`) speaks the profile's dialect: `glm` for Z.ai's
API and `glm-sglang` for a GLM model served by SGLang send each assistant turn's reasoning back
with later requests; `openai` does not. The conversation is compacted so long runs fit the
context window, counting the reasoning that is sent back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra_agent.agent.model.dialects import dialect_of
from infra_agent.agent.policies.base import ModelTurn, Policy, PolicySpec, no_script
from infra_agent.agent.state import AgentState, Message
from infra_agent.config import LLMSettings
from infra_agent.errors import UserError

if TYPE_CHECKING:
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.agent.model.client import ChatClient
    from infra_agent.tasks.manifest import Task

KEEP_RECENT = 8
"""Messages at the end of the conversation that are never compacted."""
COMPACT_TO = 300
"""Characters kept of an old tool result."""


def _size(m: Message, reasoning: bool) -> int:
    return len(m.content) + (len(m.reasoning_content or "") if reasoning else 0)


def compact(messages: list[Message], max_chars: int, *, reasoning: bool = False) -> list[Message]:
    """The conversation cut to fit `max_chars`, oldest first: old tool results are shortened,
    then (when `reasoning` is sent back) old assistant turns lose their reasoning whole.

    Reasoning is dropped, never cut: Z.ai asks for it back unmodified or not at all. The system
    prompt and the task message stay whole; the last `KEEP_RECENT` messages are cut only if
    cutting older ones was not enough."""
    out = [m.model_copy() for m in messages]
    total = sum(_size(m, reasoning) for m in out)
    # Old results first, then old reasoning; if that is not enough, all but the last two.
    for keep in (KEEP_RECENT, 2):
        for i, m in enumerate(out[: max(0, len(out) - keep)]):
            if total <= max_chars:
                return out
            if m.role == "tool" and len(m.content) > COMPACT_TO:
                cut = (
                    m.content[:COMPACT_TO]
                    + f"\n[compacted: {len(m.content) - COMPACT_TO} characters of an old result]"
                )
                total -= len(m.content) - len(cut)
                out[i] = m.model_copy(update={"content": cut})
        for i, m in enumerate(out[: max(0, len(out) - keep)]):
            if total <= max_chars:
                return out
            if reasoning and m.role == "assistant" and m.reasoning_content:
                total -= len(m.reasoning_content)
                out[i] = m.model_copy(update={"reasoning_content": None})
    return out


class LLMPolicy:
    """Asks a chat model for the next move, with the conversation compacted to fit."""

    name = "llm"

    def __init__(self, chat: ChatClient, *, max_context_chars: int = 60_000) -> None:
        self.chat = chat
        self.model: str | None = chat.model
        self.max_context_chars = max_context_chars

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        reasoning = self.chat.returns_reasoning
        messages = compact(state.messages, self.max_context_chars, reasoning=reasoning)
        return self.chat.complete(messages, tools)


def _check(llm: LLMSettings, script: Path | None) -> str:
    no_script(script)
    if not llm.configured():
        raise UserError(
            "--policy llm needs an endpoint: set OPENAI_BASE_URL (and OPENAI_API_KEY) or "
            "llm.endpoint.base_url / llm.profile in infra-agent.toml"
        )
    profile = llm.active()
    return (
        f"llm policy: model {profile.model} at {profile.base_url}"
        f" ({dialect_of(profile).name} dialect)"
    )


def _build(config: RunConfig, llm: LLMSettings, task: Task) -> Policy:
    from infra_agent.agent.model.client import ChatClient

    profile = llm.active()
    chars = profile.context_chars or config.max_context_chars
    return LLMPolicy(ChatClient(profile), max_context_chars=chars)


SPEC = PolicySpec("llm", _check, _build)
