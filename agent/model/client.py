"""The chat client: one streamed chat completion with tools, shaped by the profile's dialect.

Each request streams (a slow reply stays visible; tool-call arguments arrive in fragments that are
assembled here), is retried with exponential backoff on rate limits (429), server errors (5xx),
timeouts and dropped connections, and every failed attempt is reported so the run log keeps it.
The reply's reasoning, cached prompt tokens and reasoning tokens are kept with it, and its cost
is priced with the profile's prices.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from infra_agent.agent.model.dialects import dialect_of
from infra_agent.agent.model.usage import TokenUsage
from infra_agent.agent.policies.base import ModelError, ModelTurn
from infra_agent.agent.state import Message
from infra_agent.config import LLMProfile
from infra_agent.store.records import ToolCall

BACKOFF_S = 1.0
"""First retry delay, doubled per attempt (Retry-After wins when the server sends it)."""
MAX_BACKOFF_S = 30.0


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


class _Reply:
    """A streamed reply assembled from its chunks: text, reasoning and tool-call fragments."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, str]] = {}
        self.logprobs: list[dict[str, Any]] = []
        self.usage = TokenUsage()

    def add(self, chunk: Any) -> None:
        """Take one chunk of a stream."""
        if chunk.usage is not None:
            self.usage = TokenUsage.of(chunk.usage)
        for choice in chunk.choices:
            self._part(choice.delta, choice.logprobs, streamed=True)

    def add_whole(self, completion: Any) -> None:
        """Take a completion that was not streamed."""
        self.usage = TokenUsage.of(completion.usage)
        choice = completion.choices[0]
        self._part(choice.message, choice.logprobs, streamed=False)

    def _part(self, delta: Any, logprobs: Any, *, streamed: bool) -> None:
        if delta.content:
            self.content.append(delta.content)
        reasoning = (delta.model_extra or {}).get("reasoning_content")
        if reasoning:
            self.reasoning.append(str(reasoning))
        for i, call in enumerate(delta.tool_calls or []):
            slot = self.calls.setdefault(
                call.index if streamed else i, {"id": "", "name": "", "arguments": ""}
            )
            slot["id"] = call.id or slot["id"]
            if call.function is not None:
                name = call.function.name or ""
                if name != slot["name"]:  # some servers repeat the whole name per fragment
                    slot["name"] += name
                slot["arguments"] += call.function.arguments or ""
        if logprobs is not None and logprobs.content:
            self.logprobs.extend({"token": t.token, "logprob": t.logprob} for t in logprobs.content)

    def message(self) -> Message:
        return Message(
            role="assistant",
            content="".join(self.content),
            reasoning_content="".join(self.reasoning) or None,
            tool_calls=[
                ToolCall(id=c["id"] or f"call_{i}", name=c["name"], arguments=c["arguments"])
                for i, c in sorted(self.calls.items())
            ],
        )


class ChatClient:
    """Streams chat completions with tools from the endpoint of `profile`, in its dialect."""

    def __init__(self, profile: LLMProfile, *, sleep: Callable[[float], None] = time.sleep) -> None:
        import openai

        self.profile = profile
        self.model = profile.model
        self.dialect = dialect_of(profile)
        self.client = openai.OpenAI(
            base_url=profile.base_url,
            api_key=profile.resolved_key() or "none",
            timeout=profile.timeout_s,
            max_retries=0,  # retried here, so every failed attempt is recorded
        )
        self.sleep = sleep
        self.logprobs = self.dialect.logprobs
        """Ask for logprobs (the openai dialect stops after the endpoint refuses them once)."""
        self.stream = True

    @property
    def returns_reasoning(self) -> bool:
        """Earlier turns' reasoning goes back with each request (so it counts in the context)."""
        return self.dialect.returns_reasoning

    def complete(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelTurn:
        """The next assistant turn, or a turn with only errors when every attempt failed."""
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
                if kind == "bad_request" and self.dialect.learns_refusals:
                    if self.logprobs or self.stream:
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

    def _once(self, messages: list[Message], tools: list[dict[str, Any]]) -> ModelTurn:
        body = self.dialect.request(
            self.profile, messages, tools, stream=self.stream, logprobs=self.logprobs
        )
        fixed = {k: body.pop(k) for k in ("model", "messages")}
        stream = body.pop("stream", False)
        # Everything else goes as is: the dialect decided each field.
        response = self.client.chat.completions.create(**fixed, stream=stream, extra_body=body)
        reply = _Reply()
        if stream:
            for chunk in response:
                reply.add(chunk)
        else:
            reply.add_whole(response)
        return self._turn(reply, streamed=stream)

    def _turn(self, reply: _Reply, *, streamed: bool) -> ModelTurn:
        usage = reply.usage
        return ModelTurn(
            message=reply.message(),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cost_usd=usage.cost_usd(self.profile),
            logprobs=reply.logprobs or None,
            streamed=streamed,
        )
