"""Token accounting of one model reply: what the endpoint reported, and what it cost."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from infra_agent.config import LLMProfile


class TokenUsage(BaseModel):
    """One reply's tokens as the endpoint reported them (counts of tokens)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    """Generated tokens, reasoning included."""
    cached_prompt_tokens: int | None = None
    """`prompt_tokens_details.cached_tokens` (Z.ai; SGLang with --enable-cache-report)."""
    reasoning_tokens: int | None = None
    """`completion_tokens_details.reasoning_tokens`, or SGLang's `usage.reasoning_tokens`."""

    @classmethod
    def of(cls, usage: Any) -> TokenUsage:
        """Read an OpenAI SDK `CompletionUsage` (None: nothing reported)."""
        if usage is None:
            return cls()
        prompt = getattr(usage, "prompt_tokens_details", None)
        completion = getattr(usage, "completion_tokens_details", None)
        reasoning = getattr(completion, "reasoning_tokens", None)
        if reasoning is None:  # SGLang also reports it beside the totals
            reasoning = (getattr(usage, "model_extra", None) or {}).get("reasoning_tokens")
        return cls(
            prompt_tokens=usage.prompt_tokens or 0,
            completion_tokens=usage.completion_tokens or 0,
            cached_prompt_tokens=getattr(prompt, "cached_tokens", None),
            reasoning_tokens=int(reasoning) if reasoning is not None else None,
        )

    def cost_usd(self, profile: LLMProfile) -> float:
        """USD at the profile's prices: cached prompt tokens at the cached-input price (the
        input price when the profile has none), reasoning as the completion tokens it is part of."""
        cached = min(self.cached_prompt_tokens or 0, self.prompt_tokens)
        cached_price = profile.cached_input_cost_per_mtok
        if cached_price is None:
            cached_price = profile.input_cost_per_mtok
        return (
            (self.prompt_tokens - cached) * profile.input_cost_per_mtok
            + cached * cached_price
            + self.completion_tokens * profile.output_cost_per_mtok
        ) / 1e6
