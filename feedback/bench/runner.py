"""Adaptive, interleaved microbenchmark of a baseline and a candidate.

`run_bench(baseline, candidate, ...) -> BenchResult`:
1. warm up both arms (`warmup_s` each, at least one call);
2. calibrate the iterations per sample so one sample lasts at least `min_sample_s` on the
   slower arm (the same count for both arms);
3. sample in rounds, alternating the order AB, BA, AB... (so neither arm always runs first);
4. every few rounds (after `min_samples` per arm) compute `compare_samples(paired=True)` and
   stop when the relative width of the confidence interval of the speedup is below `ci_width`,
   or the interval is decisive: entirely inside the equivalence band (SAME) or entirely outside
   it (a clear FASTER/SLOWER); otherwise when `budget_s` or `max_samples` runs out.
Samples are seconds per iteration; speedup > 1 means the candidate is faster.
Noise flags from `compare_samples`, plus `short_samples` (a sample shorter than `min_sample_s`
even at the iteration cap), `cpu_freq_drop` and `thermal_throttle` where /sys makes them readable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.feedback.bench.counters import HardwareCounters, hardware_counters
from infra_agent.feedback.bench.targets import CallableTarget, CudaTarget, Target
from infra_agent.judgement import Comparison, compare_samples

StopReason = Literal["ci_width", "decided", "budget", "max_samples"]

MAX_ITERATIONS = 1_000_000
CHECK_EVERY = 4
"""Rounds between two interval computations."""


class BenchResult(BaseModel):
    """One benchmark: the comparison plus how it was measured."""

    comparison: Comparison
    baseline_samples_s: list[float] = Field(default_factory=list)
    """Seconds per iteration, one per sample, in measurement order."""
    candidate_samples_s: list[float] = Field(default_factory=list)
    iterations_per_sample: int
    warmup_calls: list[int] = Field(default_factory=list)
    """Calls each arm made while warming up (baseline, candidate), before any timing."""
    calibration_steps: list[int] = Field(default_factory=list)
    """Iteration counts tried while calibrating, the last one kept."""
    timer: str
    """perf_counter_ns, cuda_events, cuda_graph, command_wall or worker:perf_counter_ns."""
    rounds: int
    elapsed_s: float
    """Wall time of the whole benchmark, warm-up included."""
    stopped: StopReason
    ci_width_target: float
    counters: HardwareCounters | None = None
    counters_unavailable: str | None = None
    """Why there are no hardware counters, e.g. 'unavailable: ncu not found on PATH'."""
    baseline_name: str = "baseline"
    candidate_name: str = "candidate"

    def render(self) -> str:
        c = self.comparison
        lines = [
            f"{c.verdict}: candidate {c.speedup:.3f}x vs baseline "
            f"({c.confidence:.0%} CI {c.ci_low:.3f}-{c.ci_high:.3f}); "
            f"median {_fmt_s(c.baseline_median)} -> {_fmt_s(c.candidate_median)} per call",
            f"{c.n_baseline}+{c.n_candidate} interleaved samples x {self.iterations_per_sample} "
            f"iterations after {'+'.join(map(str, self.warmup_calls)) or 0} warm-up calls, "
            f"{self.timer}, {self.elapsed_s:.1f} s, stopped on {self.stopped}",
        ]
        if c.noise_detail:
            lines.append("noise: " + "; ".join(c.noise_detail))
        if self.counters is not None:
            lines.append(self.counters.render())
        elif self.counters_unavailable:
            lines.append(f"hardware counters {self.counters_unavailable}")
        return "\n".join(lines)


def _fmt_s(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def _cpu_state() -> dict[str, int]:
    """Current CPU frequencies (kHz) and throttle counters, whatever /sys lets us read."""
    state: dict[str, int] = {}
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            state[f"freq:{path.parent.parent.name}"] = int(path.read_text())
        except (OSError, ValueError):
            continue
    pattern = "cpu[0-9]*/thermal_throttle/core_throttle_count"
    for path in Path("/sys/devices/system/cpu").glob(pattern):
        try:
            state[f"throttle:{path.parent.parent.name}"] = int(path.read_text())
        except (OSError, ValueError):
            continue
    return state


def _cpu_flags(before: dict[str, int], after: dict[str, int]) -> list[tuple[str, str]]:
    flags: list[tuple[str, str]] = []
    freqs = [(before[k], after[k]) for k in before if k.startswith("freq:") and k in after]
    if freqs:
        b = sum(x for x, _ in freqs) / len(freqs)
        a = sum(y for _, y in freqs) / len(freqs)
        if b > 0 and a < 0.9 * b:
            flags.append(("cpu_freq_drop", f"cpu_freq_drop: mean CPU clock fell {1 - a / b:.0%}"))
    throttled = sum(
        after[k] - before[k] for k in before if k.startswith("throttle:") and k in after
    )
    if throttled > 0:
        flags.append(("thermal_throttle", f"thermal_throttle: {throttled} throttle events"))
    return flags


def _as_target(arm: Target | Callable[[], Any], clock: str) -> Target:
    if isinstance(arm, CallableTarget | CudaTarget) or hasattr(arm, "sample"):
        return arm  # type: ignore[return-value]
    return CallableTarget(arm, clock=clock)


def _decisive(c: Comparison) -> bool:
    band_low, band_high = 1.0 / (1.0 + c.equivalence), 1.0 + c.equivalence
    return c.verdict == "SAME" or c.ci_low > band_high or c.ci_high < band_low


def make_target(
    fn: Callable[[], Any],
    *,
    device: str = "cpu",
    clock: str = "wall",
    flush_l2: bool = False,
    cuda_graph: bool = False,
) -> Target:
    """Wrap a callable in the right timer: 'cpu' (perf_counter_ns or thread CPU time with
    clock='cpu') or 'cuda' (CUDA events)."""
    if device == "cuda":
        return CudaTarget(fn, flush_l2=flush_l2, cuda_graph=cuda_graph)
    if device != "cpu":
        raise UserError(f"unknown device {device!r}: expected 'cpu' or 'cuda'")
    if flush_l2 or cuda_graph:
        raise UserError("--flush-l2 and --cuda-graph need device 'cuda'")
    return CallableTarget(fn, clock=clock)


def _calibrate(
    targets: list[Target], min_sample_s: float, max_iterations: int, tried: list[int]
) -> int:
    """Smallest power of two of iterations for which every arm's sample lasts min_sample_s
    (each count tried is appended to `tried`)."""
    iterations = 1
    while iterations < max_iterations:
        tried.append(iterations)
        slowest = max(t.sample(iterations) * iterations for t in targets)
        if slowest >= min_sample_s:
            return iterations
        # Jump close to the target in one step, then the loop confirms it.
        grow = min_sample_s / max(slowest, 1e-9)
        iterations = min(max_iterations, max(iterations * 2, int(iterations * grow * 1.2)))
    return max_iterations


def run_bench(
    baseline: Target | Callable[[], Any],
    candidate: Target | Callable[[], Any],
    *,
    min_sample_s: float = 0.005,
    warmup_s: float = 0.05,
    ci_width: float = 0.02,
    confidence: float = 0.95,
    equivalence: float = 0.02,
    budget_s: float = 10.0,
    min_samples: int = 10,
    max_samples: int = 400,
    max_iterations: int = MAX_ITERATIONS,
    seed: int = 0,
    clock: str = "wall",
    with_counters: bool = False,
    names: tuple[str, str] = ("baseline", "candidate"),
) -> BenchResult:
    """Benchmark two arms; see the module docstring. Plain callables are timed on CPU with
    `clock` ('wall' or 'cpu', see `CallableTarget`).

    `ci_width` is the target width of the interval relative to the speedup (0.02 = 2%).
    The targets are closed on return.
    """
    if budget_s <= 0 or min_sample_s <= 0 or ci_width <= 0:
        raise UserError("budget_s, min_sample_s and ci_width must be positive")
    arms: list[Target] = [_as_target(t, clock) for t in (baseline, candidate)]
    started = time.perf_counter()
    cpu_before = _cpu_state()

    def compare(samples: list[list[float]]) -> Comparison:
        return compare_samples(
            samples[0], samples[1], higher_is_better=False, confidence=confidence, seed=seed,
            paired=True, equivalence=equivalence,
        )  # fmt: skip

    try:
        warmup_calls = [_warm_up(arm, warmup_s) for arm in arms]
        tried: list[int] = []
        iterations = _calibrate(arms, min_sample_s, max_iterations, tried)
        samples, rounds, stopped, comparison = _sample_until_decided(
            arms, iterations, compare, ci_width=ci_width, min_samples=min_samples,
            max_samples=max_samples, deadline=started + budget_s,
        )  # fmt: skip
        _note_noise(comparison, arms, samples, iterations, min_sample_s, cpu_before)
        counters, unavailable = hardware_counters(arms) if with_counters else (None, None)
        return BenchResult(
            comparison=comparison,
            baseline_samples_s=samples[0],
            candidate_samples_s=samples[1],
            iterations_per_sample=iterations,
            warmup_calls=warmup_calls,
            calibration_steps=tried,
            timer=arms[0].timer,
            rounds=rounds,
            elapsed_s=time.perf_counter() - started,
            stopped=stopped,
            ci_width_target=ci_width,
            counters=counters,
            counters_unavailable=unavailable,
            baseline_name=names[0],
            candidate_name=names[1],
        )
    finally:
        for arm in arms:
            arm.close()


def _warm_up(arm: Target, warmup_s: float) -> int:
    """Call `arm` once, then again until `warmup_s` has passed; how many calls it took."""
    warm_end = time.perf_counter() + warmup_s
    arm.sample(1)
    calls = 1
    while time.perf_counter() < warm_end:
        arm.sample(1)
        calls += 1
    return calls


def _sample_until_decided(
    arms: list[Target], iterations: int, compare: Callable[[list[list[float]]], Comparison], *,
    ci_width: float, min_samples: int, max_samples: int, deadline: float,
) -> tuple[list[list[float]], int, StopReason, Comparison]:  # fmt: skip
    """Alternate the arms' samples (ABBA order) until the interval is narrow enough, the
    comparison is decisive, `max_samples` rounds ran, or `deadline` (perf_counter) passed after
    at least 3 rounds: (samples per arm, rounds, why it stopped, the final comparison)."""
    samples: list[list[float]] = [[], []]
    rounds = 0
    stopped: StopReason = "budget"
    comparison: Comparison | None = None
    while True:
        order = (0, 1) if rounds % 2 == 0 else (1, 0)
        for i in order:
            samples[i].append(arms[i].sample(iterations))
        rounds += 1
        enough = rounds >= min_samples
        if enough and (rounds % CHECK_EVERY == 0):
            comparison = compare(samples)
            if (comparison.ci_high - comparison.ci_low) / comparison.speedup < ci_width:
                stopped = "ci_width"
                break
            if _decisive(comparison):
                stopped = "decided"
                break
        if rounds >= max_samples:
            stopped = "max_samples"
            break
        if time.perf_counter() > deadline and rounds >= 3:
            stopped = "budget"
            break
    if stopped not in ("ci_width", "decided") or comparison is None:
        comparison = compare(samples)
    return samples, rounds, stopped, comparison


def _note_noise(
    comparison: Comparison, arms: list[Target], samples: list[list[float]], iterations: int,
    min_sample_s: float, cpu_before: dict[str, int],
) -> None:  # fmt: skip
    """Add to the comparison's noise what the run itself saw: CPU frequency or load changes,
    samples shorter than asked, a wall clock on a noisy machine."""
    extra = _cpu_flags(cpu_before, _cpu_state())
    short = min(min(s) for s in samples) * iterations
    if short < min_sample_s / 2:
        extra.append(("short_samples", f"short_samples: shortest sample {short * 1e3:.3f} ms"))
    if "high_iqr" in comparison.noise and arms[0].timer in (
        "perf_counter_ns",
        "sandbox:perf_counter_ns",
    ):
        extra.append(("", "wall clock on a busy machine? clock='cpu' counts only CPU time"))
    for code, detail in extra:
        if code and code not in comparison.noise:
            comparison.noise.append(code)
        comparison.noise_detail.append(detail)
