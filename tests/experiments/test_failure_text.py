"""A failed arm's reason says what happened even when the exception has no message (an HTTP
client's ReadError on a dropped connection once read "baseline failed ...: " and nothing more)."""

from __future__ import annotations

import httpx

from infra_agent.errors import describe
from infra_agent.experiments.cascade import _failure
from infra_agent.store.verdict import Flag, Verdict


def dropped_connection() -> httpx.ReadError:
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError as cause:
            raise httpx.ReadError("") from cause
    except httpx.ReadError as error:
        return error


def test_an_exception_without_a_message_is_named_with_its_cause() -> None:
    assert describe(dropped_connection()) == (
        "ReadError (no message; caused by ConnectionResetError: "
        "[Errno 104] Connection reset by peer)"
    )
    assert describe(TimeoutError()) == "TimeoutError (no message)"
    assert describe(ValueError("first line\nsecond")) == "first line"
    assert describe(ValueError("bad"), typed=True) == "ValueError: bad"


def test_a_failed_baseline_and_a_harness_error_name_the_dropped_connection() -> None:
    stop = _failure("baseline", dropped_connection())
    assert stop.verdict == Verdict.FAILED and Flag.BASELINE_FAILED in stop.flags
    assert stop.reasons[0].endswith("ReadError (no message; caused by ConnectionResetError: "
                                    "[Errno 104] Connection reset by peer)")  # fmt: skip
    stop = _failure("candidate", dropped_connection())
    assert "harness error while running the candidate: ReadError (no message" in (stop.reasons[0])
