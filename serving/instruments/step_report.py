"""The scheduler's steps as records: one step as its log line tells it (`SchedulerStep`), a slice
of the timeline (`Bucket`) and a workload's report (`StepReport`), with its rendering for a
model: the headline first (who waited, behind what, how long a step took), then the split,
the step time by batch size and a bounded timeline. Built by `serving/instruments/steps.py`.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field


class StepKind(str, Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class SchedulerStep(BaseModel):
    """One scheduler step as its log line tells it."""

    t_s: float
    """Seconds since the first step line read."""
    kind: StepKind
    running: int
    """Requests in the running batch: decoded together (decode); already running before the
    admitted ones (prefill)."""
    queued: int
    """Requests waiting to be admitted, after this step's admissions."""
    tokens: int
    """Tokens the step computed: new prompt tokens (prefill), one per running request (decode)."""
    new_seqs: int = 0
    """Requests admitted by this prefill."""
    cached_tokens: int = 0
    """Prompt tokens found in the prefix cache (prefill)."""
    kv_tokens: int | None = None
    """Tokens held in the KV cache (decode)."""
    kv_usage: float | None = None
    """Share of the KV pool in use ('token usage'), None where the line has none."""
    iteration: int | None = None
    """SGLang's forward-step number (SGLANG_LOG_FORWARD_ITERS=1), None without it."""
    duration_ms: float | None = None
    """Time of the step's scheduler cycle, ms (see the module docstring; None when the log cannot
    tell: second timestamps, the first lines, unlogged steps or an idle gap)."""


class Bucket(BaseModel):
    """One slice of the timeline."""

    t0_s: float
    t1_s: float
    decode_steps: int
    prefill_steps: int
    running_max: int
    queued_first: int
    queued_last: int
    decode_ms_median: float | None
    prefill_tokens: int


class StepReport(BaseModel):
    """The scheduler's steps during one workload and what they add up to."""

    version: int = 1
    source: str
    cap: int | None
    """max-running-requests of the server (None: unknown)."""
    window_s: float
    """From the first to the last step line."""
    decode_steps: int
    prefill_steps: int
    running_max: int
    queued_max: int
    queued_decode_steps: int
    """Decode steps with at least one request waiting."""
    queued_at_cap_steps: int
    """...of them, steps whose running batch was at the cap."""
    decode_ms_median: float | None
    decode_ms_by_running: dict[int, tuple[float, int]]
    """Running requests -> (median measured decode step ms, steps measured)."""
    prefill_tokens_median: float | None
    prefill_tokens_max: int
    decode_ms_total: float
    prefill_ms_total: float
    decode_timed: int | None = None
    """Decode steps whose time the log told (the rest are in 'idle or untimed'); None in
    reports made before it was kept."""
    prefill_timed: int | None = None
    ms_clock: bool
    """True when the log had millisecond timestamps (SGLANG_LOG_MS=1)."""
    overlap: bool
    """True when the server ran the overlap scheduler (a step's line follows the next step)."""
    unlogged_iterations: int = 0
    """Forward steps whose number never appeared (idle or unlogged steps)."""
    kv_usage_max: float | None = None
    """Highest share of the KV pool in use at any step (None: the lines did not say)."""
    retractions: int = 0
    """Decode steps that found the KV pool full and sent requests back to the queue."""
    retracted_requests: int = 0
    """Requests sent back by them (their KV freed, recomputed when readmitted)."""
    timeline: list[Bucket] = Field(default_factory=list)
    steps: list[SchedulerStep] = Field(default_factory=list)
    steps_dropped: int = 0
    """Steps counted above but left out of `steps` (beyond MAX_STEPS)."""

    def headline(self) -> str:
        """The decisive fact: who waited, behind what, and how long a step took."""
        total = self.decode_steps + self.prefill_steps
        if total == 0:
            return (
                "no scheduler step lines in the server log (is --decode-log-interval set and "
                "the log level info?)"
            )
        step = self._typical_step()
        cap = f" (max-running-requests {self.cap})" if self.cap else ""
        if self.queued_decode_steps == 0:
            return (
                f"no queueing: no request waited during any of {self.decode_steps} decode steps; "
                f"up to {self.running_max} running{cap}{step}"
            )
        n = max(self.decode_steps, 1)
        if self.cap is None:
            return (
                f"queueing: up to {self.queued_max} requests waited in "
                f"{100 * self.queued_decode_steps / n:.0f}% of decode steps "
                f"({self.queued_decode_steps} of {self.decode_steps}) behind up to "
                f"{self.running_max} running (max-running-requests unknown){step}"
            )
        if self.queued_at_cap_steps * 2 >= self.queued_decode_steps:
            return (
                f"queueing: up to {self.queued_max} requests waited behind {self.cap} running"
                f"{cap} in {100 * self.queued_at_cap_steps / n:.0f}% of decode steps "
                f"({self.queued_at_cap_steps} of {self.decode_steps}){step}"
            )
        return (
            f"queueing below the cap: up to {self.queued_max} requests waited in "
            f"{100 * self.queued_decode_steps / n:.0f}% of decode steps, mostly while fewer than "
            f"{self.cap} ran{cap} (admission held them: prefill chunks or KV memory){step}"
        )

    def _typical_step(self) -> str:
        if not self.decode_ms_by_running:
            return ""
        running = max(self.decode_ms_by_running, key=lambda r: self.decode_ms_by_running[r][1])
        return f"; decode step {self.decode_ms_by_running[running][0]:.0f} ms median at {running} running"

    def render(self) -> str:
        """Headline, prefill/decode split, step time by batch size, a bounded timeline."""
        lines = [self.headline()]
        if self.decode_steps + self.prefill_steps == 0:
            return lines[0]
        busy = self.decode_ms_total + self.prefill_ms_total
        window_ms = max(self.window_s * 1e3, busy, 1e-9)
        split = (
            f"split over {self.window_s:.1f} s: decode {self.decode_steps} steps"
            f"{_untimed(self.decode_steps, self.decode_timed)} "
            f"({100 * self.decode_ms_total / window_ms:.0f}% of the time"
        )
        split += (
            f", median {self.decode_ms_median:.0f} ms)"
            if self.decode_ms_median is not None
            else ")"
        )
        split += (
            f", prefill {self.prefill_steps} steps{_untimed(self.prefill_steps, self.prefill_timed)} "
            f"({100 * self.prefill_ms_total / window_ms:.0f}%"
            f", median {self.prefill_tokens_median or 0:.0f} new tokens, max {self.prefill_tokens_max})"
            f", idle or untimed {max(0.0, 100 * (1 - busy / window_ms)):.0f}%"
            " (shares of the window from the first to the last step line: step times summed)"
        )
        lines.append(split)
        if self.decode_ms_by_running:
            common = sorted(sorted(self.decode_ms_by_running.items(), key=lambda kv: -kv[1][1])[:8])
            lines.append(
                "decode step by running requests: "
                + ", ".join(
                    f"{r}: {ms:.0f} ms ({ms / max(r, 1):.1f} ms/token, {n} steps)"
                    for r, (ms, n) in common
                )
            )
        if self.kv_usage_max is not None:
            retracted = (
                f"{self.retractions} retractions (KV pool full: {self.retracted_requests} requests "
                "sent back to the queue, their KV recomputed on readmission)"
                if self.retractions
                else "no retraction"
            )
            lines.append(f"KV cache: peak {self.kv_usage_max:.0%} of the pool in use; {retracted}")
        if not self.ms_clock:
            lines.append("timestamps in whole seconds: step times unknown (set SGLANG_LOG_MS=1)")
        if self.unlogged_iterations:
            lines.append(
                f"{self.unlogged_iterations} forward steps left no line (idle or unlogged)"
            )
        if self.timeline:
            width = self.timeline[0].t1_s - self.timeline[0].t0_s
            lines.append(f"timeline ({len(self.timeline)} x {width:.2f} s):")
            lines.append(
                "  (per slice: decode steps (median step time), prefill steps (new prompt "
                "tokens), most requests running, requests queued at its first -> last step)"
            )
            for b in self.timeline:
                dec = f"{b.decode_ms_median:.0f} ms" if b.decode_ms_median is not None else "-"
                lines.append(
                    f"  {b.t0_s:6.2f}-{b.t1_s:6.2f} s  decode {b.decode_steps:4d} ({dec:>6})  "
                    f"prefill {b.prefill_steps:3d} ({b.prefill_tokens} tok)  "
                    f"running <={b.running_max}  queued {b.queued_first}->{b.queued_last}"
                )
        return "\n".join(lines)


def _untimed(steps: int, timed: int | None) -> str:
    """', 3 timed' where the log left some steps untimed (their time counts as untimed): a
    relay run read 'prefill 0%' beside 5,390 prefill tokens as prefill costing nothing."""
    return "" if timed is None or timed == steps else f", {timed} timed"
