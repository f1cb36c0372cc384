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


def test_scoring_on_the_baseline_server_that_fails_is_the_baseline_s_failure() -> None:
    """The likelihood check scores the candidate's outputs on the baseline server: a timeout
    there (a relay run's faulty baseline on a loaded machine, 'ReadTimeout' read as the
    candidate's harness error) is the baseline's failure, not charged to the patch."""
    import random
    from types import SimpleNamespace

    import httpx

    from infra_agent.experiments.arms import load_harness
    from infra_agent.serving.load.generator import RequestRecord
    from infra_agent.tasks.harness import BaselineFailure
    from infra_agent.tasks.registry import find_task

    task = find_task("sglang-cpu-tiny")
    harness = load_harness(task, dict(task.manifest.params))
    record = RequestRecord(session=0, turn=0, success=True, prompt_tokens=2, prompt_ids=[1, 2],
                           output_ids=[3, 4])  # fmt: skip
    harness.arms = {
        name: SimpleNamespace(name=name, state={"runs": {7: [record]}})
        for name in ("baseline", "candidate")
    }

    class TimingOut:
        def call(self, fn, *args):  # type: ignore[no-untyped-def]
            raise httpx.ReadTimeout("timed out")

        def alive(self) -> bool:
            return True

    harness.server = lambda arm: TimingOut()  # type: ignore[method-assign]
    try:
        harness.judge([7], 4, random.Random(0))
    except BaselineFailure as exc:
        failure = exc
    else:
        raise AssertionError("the scoring failure was not raised")
    assert (
        "on the baseline server failed (ReadTimeout: timed out; the server is still running)"
        in str(failure)
    )
    stop = _failure("candidate", failure)
    assert stop.verdict == Verdict.FAILED and Flag.BASELINE_FAILED in stop.flags
    assert stop.reasons[0].startswith("baseline failed, so nothing can be compared")
