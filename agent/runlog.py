"""The run log: every message, tool call, tool result, experiment and decision, as it happens.

Everything is redacted (API keys, tokens, secret environment values) before it reaches the store.
"""

from __future__ import annotations

from typing import Any

from infra_agent.agent.state import Message
from infra_agent.redact import redact_text as redact
from infra_agent.store import RunStore
from infra_agent.store.records import StepRecord, ToolCall


def _redact_opt(text: str | None) -> str | None:
    return None if text is None else redact(text)


class RunLog:
    """Appends the run's steps to the store (one row per message, in order)."""

    def __init__(self, store: RunStore, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    def message(
        self,
        message: Message,
        *,
        error: str | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        cost_usd: float | None = None,
        logprobs: list[dict[str, Any]] | None = None,
    ) -> StepRecord:
        calls = [
            ToolCall(id=c.id, name=redact(c.name), arguments=redact(c.arguments))
            for c in message.tool_calls
        ]
        return self.store.add_step(
            StepRecord(
                run_id=self.run_id,
                role=message.role,
                content=redact(message.content),
                reasoning_content=_redact_opt(message.reasoning_content),
                tool_calls=calls,
                tool_call_id=message.tool_call_id,
                name=message.name,
                error=_redact_opt(error),
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cost_usd=cost_usd,
                logprobs=logprobs,
            )
        )

    def harness(
        self, text: str, *, error: str | None = None, name: str | None = None
    ) -> StepRecord:
        """A note from the loop itself: baseline, a decision, a budget stop, a model error."""
        return self.store.add_step(
            StepRecord(
                run_id=self.run_id,
                role="harness",
                content=redact(text),
                name=name,
                error=_redact_opt(error),
            )
        )
