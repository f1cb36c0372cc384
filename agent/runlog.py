"""The run log: every message, tool call, tool result, experiment and decision, as it happens.

The store redacts secrets (API keys, tokens, secret environment values) from every step before
writing it."""

from __future__ import annotations

from typing import Any

from infra_agent.agent.state import Message
from infra_agent.store import RunStore
from infra_agent.store.records import StepRecord


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
        return self.store.add_step(
            StepRecord(
                run_id=self.run_id,
                role=message.role,
                content=message.content,
                reasoning_content=message.reasoning_content,
                tool_calls=list(message.tool_calls),
                tool_call_id=message.tool_call_id,
                name=message.name,
                error=error,
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
            StepRecord(run_id=self.run_id, role="harness", content=text, name=name, error=error)
        )
