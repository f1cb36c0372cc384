"""Look up optimization skeletons (reusable patterns with a test and a worked example)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from infra_agent.tools.base import ToolResult, tool
from infra_agent.tools.context import ToolContext


class LookupSkeletons(BaseModel):
    query: str = Field(description="What you are looking at, e.g. 'split loop recomputes norm'.")
    top_k: int = Field(2, ge=1, le=7, description="How many skeletons to return.")


@tool(
    "lookup_skeletons",
    "Find optimization patterns that may apply: when each applies, how to test it, an example.",
    LookupSkeletons,
)
def lookup_skeletons(p: LookupSkeletons, ctx: ToolContext) -> ToolResult:
    from infra_agent.agent.knowledge import load_skeletons, search_skeletons

    found = search_skeletons(p.query, load_skeletons(), p.top_k)
    return ToolResult(
        content="\n\n".join(s.render() for s in found),
        data={"skeletons": [s.name for s in found]},
    )
