"""The proposal page's trajectory model (no browser): results linked to calls, errors shown once,
and no text cut without the cut said."""

from __future__ import annotations

from infra_agent.review.web.trajectory import MAX_STEP_CHARS, step_views
from infra_agent.store.records import StepRecord, ToolCall


def _steps(content: str, error: str) -> list[StepRecord]:
    call = ToolCall(id="c1", name="read_file", arguments='{"path": "a.py"}')
    return [
        StepRecord(run_id="r", seq=1, role="assistant", reasoning_content="why", tool_calls=[call]),
        StepRecord(
            run_id="r", seq=2, role="tool", name="read_file", tool_call_id="c1",
            content=content, error=error,
        ),
    ]  # fmt: skip


def test_a_result_links_to_its_call_and_an_error_in_its_content_is_shown_once() -> None:
    error = "read_file: no file 'a.py'"
    call_step, result = step_views(_steps(f"error: {error}", error))
    assert call_step.reasoning == "why" and call_step.calls[0].answered_in == 2
    assert result.answers is call_step.calls[0]
    assert result.error_in_content  # the template shows the content only


def test_an_error_past_the_cut_of_a_long_content_is_still_shown() -> None:
    error = "the tool timed out after 120 s"
    (_, result) = step_views(_steps("o" * (MAX_STEP_CHARS + 500) + error, error))
    assert result.content.endswith(f"({500 + len(error):,} more characters not shown)")
    assert not result.error_in_content and result.error == error
