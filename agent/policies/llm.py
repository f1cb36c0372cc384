"""The `llm` policy: a chat model with tool calling over any OpenAI-compatible endpoint.

Defaults suit GLM models (Z.ai's API or a self-hosted SGLang endpoint serving GLM): the reply's
`reasoning_content` is logged but never sent back, temperature 0.6. Each request streams (so a
slow reply is visible and per-token logprobs arrive when the endpoint gives them), is retried
with exponential backoff on rate limits (429), server errors (5xx), timeouts and dropped
connections, and every failed attempt is reported so the run log keeps it. Old tool results are
compacted so long runs fit the context window.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra_agent.agent.policies.base import ModelError, ModelTurn, Policy, PolicySpec, no_script
from infra_agent.agent.state import AgentState, Message
from infra_agent.config import LLMProfile, LLMSettings
from infra_agent.errors import UserError
from infra_agent.store.records import ToolCall

if TYPE_CHECKING:
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.tasks.manifest import Task

KEEP_RECENT = 8
"""Messages at the end of the conversation that are never compacted."""
COMPACT_TO = 300
"""Characters kept of an old tool result."""
BACKOFF_S = 1.0
"""First retry delay, doubled per attempt (Retry-After wins when the server sends it)."""
MAX_BACKOFF_S = 30.0


def compact(messages: list[Message], max_chars: int) -> list[Message]:
    """The conversation with old tool results cut short, oldest first, until it fits `max_chars`.

    The system prompt and the task message stay whole; the last `KEEP_RECENT` messages are cut
    only if cutting older ones was not enough."""
    out = [m.model_copy() for m in messages]
    total = sum(len(m.content) for m in out)
    # Old results first; if that is not enough, all but the last two messages.
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
    return out


def _kind(exc: Exception) -> str:
    import openai

    if isinstance(exc, openai.RateLimitError):
        return "rate_limit"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.APIStatusError):
        return "server_error" if exc.status_code >= 500 else "bad_request"
    return "other"


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class OpenAIChatModel:
    """Streams one chat completion with tools from an OpenAI-compatible endpoint."""

    def __init__(self, profile: LLMProfile, *, sleep: Callable[[float], None] = time.sleep) -> None:
        import openai

        self.profile = profile
        self.model = profile.model
        self.client = openai.OpenAI(
            base_url=profile.base_url,
            api_key=profile.resolved_key() or "none",
            timeout=profile.timeout_s,
            max_retries=0,  # retried here, so every failed attempt is recorded
        )
        self.sleep = sleep
        self.logprobs = True
        """Ask for logprobs until the endpoint refuses them once."""
        self.stream = True

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelTurn:
        errors: list[ModelError] = []
        attempt = 0
        while True:
            attempt += 1
            try:
                turn = self._once(messages, tools)
                turn.errors = errors
                return turn
            except Exception as exc:
                kind = _kind(exc)
                errors.append(
                    ModelError(
                        kind=kind, message=f"{type(exc).__name__}: {exc}"[:500], attempt=attempt
                    )
                )
                if kind == "bad_request" and (self.logprobs or self.stream):
                    # Some endpoints refuse logprobs or streaming with tools: try once without.
                    self.logprobs, self.stream = (
                        (False, self.stream) if self.logprobs else (False, False)
                    )
                    continue
                if kind in ("bad_request", "other") or attempt > self.profile.max_retries:
                    return ModelTurn(errors=errors)
                after = _retry_after(exc)
                delay = after if after is not None else BACKOFF_S * 2 ** (attempt - 1)
                self.sleep(min(delay, MAX_BACKOFF_S))

    def _once(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> ModelTurn:
        kwargs: dict[str, Any] = {
            "model": self.profile.model,
            "messages": messages,
            "temperature": self.profile.temperature,
            "max_tokens": self.profile.max_tokens,
        }
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = "auto"
        if self.logprobs:
            kwargs["logprobs"] = True
        if not self.stream:
            return self._from_completion(self.client.chat.completions.create(**kwargs))
        stream = self.client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kwargs
        )
        content: list[str] = []
        reasoning: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        logprobs: list[dict[str, Any]] = []
        prompt_tokens = completion_tokens = 0
        for chunk in stream:
            if chunk.usage is not None:
                prompt_tokens = chunk.usage.prompt_tokens or 0
                completion_tokens = chunk.usage.completion_tokens or 0
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    content.append(delta.content)
                extra = (delta.model_extra or {}).get("reasoning_content")
                if extra:
                    reasoning.append(str(extra))
                for call in delta.tool_calls or []:
                    slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = call.id or slot["id"]
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
                if choice.logprobs is not None and choice.logprobs.content:
                    logprobs.extend(
                        {"token": t.token, "logprob": t.logprob} for t in choice.logprobs.content
                    )
        tool_calls = [
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
            for i, c in sorted(calls.items())
        ]
        message = Message(
            role="assistant",
            content="".join(content),
            reasoning_content="".join(reasoning) or None,
            tool_calls=tool_calls,
        )
        return self._priced(
            ModelTurn(
                message=message,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                logprobs=logprobs or None,
                streamed=True,
            )
        )

    def _from_completion(self, completion: Any) -> ModelTurn:
        choice = completion.choices[0]
        msg = choice.message
        tool_calls = [
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments)
            for c in (msg.tool_calls or [])
        ]
        logprobs = None
        if choice.logprobs is not None and choice.logprobs.content:
            logprobs = [{"token": t.token, "logprob": t.logprob} for t in choice.logprobs.content]
        usage = completion.usage
        return self._priced(
            ModelTurn(
                message=Message(
                    role="assistant",
                    content=msg.content or "",
                    reasoning_content=(msg.model_extra or {}).get("reasoning_content"),
                    tool_calls=tool_calls,
                ),
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                logprobs=logprobs,
            )
        )

    def _priced(self, turn: ModelTurn) -> ModelTurn:
        turn.cost_usd = (
            turn.prompt_tokens * self.profile.input_cost_per_mtok
            + turn.completion_tokens * self.profile.output_cost_per_mtok
        ) / 1e6
        return turn


class LLMPolicy:
    """Asks a chat model for the next move, with the conversation compacted to fit."""

    name = "llm"

    def __init__(self, chat: OpenAIChatModel, *, max_context_chars: int = 60_000) -> None:
        self.chat = chat
        self.model: str | None = chat.model
        self.max_context_chars = max_context_chars

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        messages = [m.to_openai() for m in compact(state.messages, self.max_context_chars)]
        return self.chat.complete(messages, tools)


def _check(llm: LLMSettings, script: Path | None) -> str:
    no_script(script)
    if not llm.configured():
        raise UserError(
            "--policy llm needs an endpoint: set OPENAI_BASE_URL (and OPENAI_API_KEY) or "
            "llm.endpoint.base_url / llm.profile in infra-agent.toml"
        )
    profile = llm.active()
    return f"llm policy: model {profile.model} at {profile.base_url}"


def _build(config: RunConfig, llm: LLMSettings, task: Task) -> Policy:
    return LLMPolicy(OpenAIChatModel(llm.active()), max_context_chars=config.max_context_chars)


SPEC = PolicySpec("llm", _check, _build)
