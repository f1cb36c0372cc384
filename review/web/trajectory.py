"""The trajectory section of the proposal page: the run's steps up to the proposal.

Nothing is cut silently: every text is shown whole up to `MAX_STEP_CHARS` (a longer one says how
much is not shown), each tool call stands on its own line with its arguments whole, the model's
reasoning is shown, each tool result links to the call it answers (and back), and a tool's error
is shown once.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra_agent.review.web.guards import shown
from infra_agent.store.records import StepRecord

MAX_STEP_CHARS = 20_000
"""A step's text shown in full up to this many characters; past it the cut is said."""
SUMMARY_CHARS = 110
"""A tool call's one-line summary (name and arguments) in the collapsed trajectory."""


@dataclass
class CallView:
    """One tool call of an assistant step, linked to the step holding its result."""

    anchor: str
    """Element id of the call on the page."""
    seq: int
    """The assistant step that made the call."""
    name: str
    arguments: str
    """The arguments as the model sent them (JSON text), whole."""
    answered_in: int | None = None
    """Seq of the tool step with its result (None: not answered in the steps shown)."""

    @property
    def summary(self) -> str:
        return shown(f"{self.name}({self.arguments})", SUMMARY_CHARS)


@dataclass
class StepView:
    seq: int
    role: str
    name: str | None
    content: str
    reasoning: str | None
    calls: list[CallView]
    error: str | None
    error_in_content: bool = False
    """The content already says the error (a tool's failure): it is not shown twice."""
    answers: CallView | None = None
    """For a tool result: the call it answers."""


def step_views(steps: list[StepRecord]) -> list[StepView]:
    """The trajectory as the page shows it: every text whole up to MAX_STEP_CHARS (a longer one
    says how much is cut), reasoning included, each tool result linked to its call."""
    views: list[StepView] = []
    open_calls: dict[str, CallView] = {}
    for step in steps:
        calls = [
            CallView(
                anchor=f"call-{step.seq}-{i}", seq=step.seq, name=c.name, arguments=c.arguments
            )
            for i, c in enumerate(step.tool_calls)
        ]
        open_calls.update((c.id, v) for c, v in zip(step.tool_calls, calls, strict=True))
        answers = open_calls.pop(step.tool_call_id, None) if step.tool_call_id else None
        if answers is not None:
            answers.answered_in = step.seq
        content = shown(step.content, MAX_STEP_CHARS)
        views.append(
            StepView(
                seq=step.seq,
                role=step.role,
                name=step.name,
                content=content,
                reasoning=shown(step.reasoning_content, MAX_STEP_CHARS)
                if step.reasoning_content
                else None,
                calls=calls,
                error=shown(step.error, MAX_STEP_CHARS) if step.error else None,
                error_in_content=step.error is not None and step.error in content,
                answers=answers,
            )
        )
    return views
