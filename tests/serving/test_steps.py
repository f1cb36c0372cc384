"""The step-statistics instrument on real SGLang 0.5.23 log lines (tests/serving/data/, taken
from the sglang-cpu-tiny baseline with `--decode-log-interval 1`, SGLANG_LOG_MS=1 and
SGLANG_LOG_FORWARD_ITERS=1): 16 requests sent at once behind the cap of 4 running (burst), and
8 requests at 4/s that never queue (paced)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from infra_agent.serving.instruments import steps as steps_mod
from infra_agent.serving.instruments.steps import StepKind, parse_steps, read_report
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

DATA = Path(__file__).parent / "data"
BURST = (DATA / "sglang_steps_burst.log").read_text()
PACED = (DATA / "sglang_steps_paced.log").read_text()


def test_real_step_lines_parse_into_typed_steps() -> None:
    steps, ms_clock = parse_steps(BURST)
    assert ms_clock
    assert len(steps) == BURST.count(" batch [")  # every step line, no uvicorn/INFO line
    first, second = steps[0], steps[1]
    # [..23.522] Prefill batch [10], #new-seq: 1, #new-token: 28, ..., #running-req: 0, #queue-req: 9
    assert (first.kind, first.iteration, first.new_seqs, first.tokens) == (
        StepKind.PREFILL,
        10,
        1,
        28,
    )
    assert (first.running, first.queued, first.cached_tokens, first.t_s) == (0, 9, 0, 0.0)
    assert second.t_s == pytest.approx(0.015) and second.running == 1 and second.queued == 12
    decode = next(s for s in steps if s.kind is StepKind.DECODE)
    # [..23.574] Decode batch [14], #running-req: 4, #token: 175, ..., #queue-req: 12
    assert (decode.iteration, decode.running, decode.kv_tokens, decode.queued) == (14, 4, 175, 12)
    assert decode.tokens == 4  # one token per running request
    assert [s.iteration for s in steps] == list(range(10, 58))


def test_step_time_is_the_gap_that_the_overlap_scheduler_shifts_by_one_line() -> None:
    steps, _ = parse_steps(BURST)
    t = {s.iteration: s.t_s for s in steps}
    overlap = {s.iteration: s.duration_ms for s in read_report(BURST, cap=4, source="t").steps}
    plain = {
        s.iteration: s.duration_ms
        for s in read_report(BURST, cap=4, source="t", overlap=False).steps
    }
    # With the overlap scheduler, line 20 is written after step 21 ran: step 21 (a prefill of
    # 32 tokens) took the gap ending at line 20.
    assert overlap[21] == pytest.approx((t[20] - t[19]) * 1e3)
    assert plain[21] == pytest.approx((t[21] - t[20]) * 1e3)
    assert overlap[10] is overlap[11] is None and plain[10] is None and plain[11] is not None


def test_the_burst_leads_with_queueing_behind_the_cap() -> None:
    report = read_report(BURST, cap=4, source="burst")
    text = report.render()
    first = text.splitlines()[0]
    assert first.startswith("queueing: up to 12 requests waited behind 4 running "), first
    assert "(max-running-requests 4) in 53% of decode steps (17 of 32)" in first
    assert re.search(r"decode step \d+ ms median at 4 running$", first), first
    assert (report.decode_steps, report.prefill_steps) == (32, 16)
    assert report.queued_at_cap_steps == 17 and report.running_max == 4
    assert report.prefill_tokens_max == 64  # the chunked-prefill size of the baseline
    assert 4 in report.decode_ms_by_running and report.decode_ms_by_running[4][1] >= 15
    assert "split over 0.7 s: decode 32 steps" in text and "prefill 16 steps" in text
    assert len(report.timeline) == 10 and "timeline (10 x 0.07 s):" in text
    assert len(text) < 2000 and len(text.splitlines()) <= 16
    # Without a known cap it says so instead of naming one.
    unknown = read_report(BURST, cap=None, source="burst").headline()
    assert "max-running-requests unknown" in unknown and "behind up to 4 running" in unknown
    # Under a cap far above the batch, the wait is not the cap's doing.
    high = read_report(BURST, cap=256, source="burst").headline()
    assert high.startswith("queueing below the cap: ") and "fewer than 256 ran" in high


def test_a_paced_run_reports_no_queueing_and_leaves_idle_gaps_untimed() -> None:
    report = read_report(PACED, cap=4, source="paced")
    first = report.headline()
    assert first.startswith("no queueing: no request waited during any of 46 decode steps")
    assert "up to 3 running (max-running-requests 4)" in first
    by_iter = {s.iteration: s for s in report.steps}
    # Step 68 follows an idle gap of 0.7 s after line 67: neither it nor the next is timed.
    assert by_iter[68].duration_ms is None and by_iter[69].duration_ms is None
    assert all(s.duration_ms is None or s.duration_ms < 100 for s in report.steps)
    assert "idle or untimed" in report.render()
    # Untimed steps are counted as such, not read as steps that took no time (a relay run read
    # 'prefill 0%' beside 5,390 prefill tokens).
    assert "decode 46 steps, 40 timed (" in report.render()
    assert "prefill 8 steps, 2 timed (" in report.render()


def test_second_timestamps_give_counts_but_no_step_times() -> None:
    coarse = re.sub(r"(\d\d:\d\d:\d\d)\.\d{3}\]", r"\1]", BURST)
    report = read_report(coarse, cap=4, source="coarse")
    assert not report.ms_clock and report.decode_ms_median is None
    assert all(s.duration_ms is None for s in report.steps)
    assert report.headline().startswith("queueing: up to 12 requests waited behind 4 running")
    assert "set SGLANG_LOG_MS=1" in report.render()


def test_no_step_lines_and_kept_steps_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = read_report("[2026-12-01 21:59:23] INFO: nothing\n", cap=4, source="x")
    assert empty.render().startswith("no scheduler step lines in the server log")
    monkeypatch.setattr(steps_mod, "MAX_STEPS", 10)
    report = read_report(BURST, cap=4, source="x")
    assert len(report.steps) == 10 and report.steps_dropped == 38 and report.decode_steps == 32
    assert json.loads(report.model_dump_json())["cap"] == 4


def test_server_steps_is_offered_and_refuses_a_kernel_task(tmp_path: Path) -> None:
    reg = default_registry()
    assert "server_steps" in reg.names()
    ctx = ToolContext(
        task=find_task("decode-split-norm"), store=open_store(tmp_path / "r.db"), run_id="r"
    )
    result = reg.call("server_steps", "{}", ctx)
    assert result.error and "not a serving task" in result.error


def test_kv_usage_and_retractions_are_reported() -> None:
    """A relay run on sglang-garbled-under-load (a fault under KV pressure) asked for retraction
    counts and KV usage: the peak 'token usage' of the step lines, and SGLang's 'KV cache pool
    is full. Retract requests.' warnings (its format: Scheduler.update_running_batch, 0.5.23)."""
    report = read_report(BURST, cap=4, source="burst")
    assert report.kv_usage_max == pytest.approx(0.01) and report.retractions == 0
    assert "KV cache: peak 1% of the pool in use; no retraction" in report.render()
    warning = (
        "[2026-12-01 21:59:24.100] KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
        "#new_tokens_gained: 96, #new_token_ratio: 0.7000 -> 0.8000\n"
    )
    pressed = read_report(BURST + warning.format(n=3) + warning.format(n=2), cap=4, source="b")
    assert (pressed.retractions, pressed.retracted_requests) == (2, 5)
    assert "2 retractions (KV pool full: 5 requests sent back to the queue" in pressed.render()
