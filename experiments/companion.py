"""The metric's companion compared beside it, and a win the companion does not share.

A task's `metric.companion` is another sample key of the same direction (serving: output tokens
per server CPU-second). It does not decide the verdict; `experiments.measure.decide` states it
beside the metric and flags an IMPROVED verdict `suspicious` when the companion does not share
the gain (`unshared_gain`).
"""

from __future__ import annotations

from infra_agent.judgement import Comparison, compare_samples
from infra_agent.tasks.manifest import TaskManifest

UNSHARED_LIMIT = 1.25
"""A win is suspicious when more than this factor of it is not in the metric's companion, and
that factor is larger than the companion's own gain (`unshared_gain`)."""


def companion(
    baseline: dict[str, list[float]],
    candidate: dict[str, list[float]],
    manifest: TaskManifest,
    metrics: dict[str, float],
) -> tuple[list[str], Comparison | None]:
    """The metric's companion compared like the metric (paired bootstrap over the arms' samples,
    metric name -> samples), in words (its gain and medians), and the comparison; its speedup and
    interval are added to `metrics`. Nothing when the harness did not report it."""
    name = manifest.metric.companion
    b, k = baseline.get(name or ""), candidate.get(name or "")
    if name is None or not b or not k:
        return [], None
    n = min(len(b), len(k))
    comp = compare_samples(
        b[:n], k[:n], higher_is_better=manifest.metric.higher_is_better, paired=True
    )
    metrics.update(
        {
            f"{name}_speedup": comp.speedup,
            f"{name}_ci_low": comp.ci_low,
            f"{name}_ci_high": comp.ci_high,
        }
    )
    # Its interval is kept in `metrics`, not said: a verdict states one interval, its own.
    return [
        f"beside it (does not decide): {name} {comp.speedup:.3f}x, median "
        f"{comp.baseline_median:.4g} -> {comp.candidate_median:.4g}"
    ], comp


def unshared_gain(gain: float, shared: Comparison | None, manifest: TaskManifest) -> str | None:
    """Why a win is suspicious when its companion does not share it (in words, numbers first),
    or None.

    The metric's gain is the companion's gain times the rest (`gain / companion`). For a serving
    task the companion is output tokens per server CPU-second, so the rest is how much more CPU
    per wall-clock second the candidate's server used than the baseline's. An engine that does
    its work with less CPU shows it in the companion: a larger batch or a fixed fault raises
    both about alike, and the server runs its model on one compute thread (OMP_NUM_THREADS=1),
    so it cannot use much more CPU per second. A gain that is mostly more CPU per second is what
    starving the other arm produces (its server stopped, reniced or pinned to a busy core while
    measured: throughput 1.50x and 1.61x in issue 33, the companion 1.01-1.09x), or work spread
    over more cores: a person decides.

    Flagged when the rest exceeds `UNSHARED_LIMIT` and exceeds the companion's own gain (the
    companion carries less than half of the win, on a log scale), so that a large honest win
    whose extra tokens cost some extra CPU per second (the tokenizer process streams more tokens
    per second) is not flagged. Measured at load 5-10 on 2 cores, the rest of honest wins was
    0.99-1.10x: the reference fixes of sglang-slow-decode 2.57x/2.36x, sglang-stalled-scheduler
    2.11x/2.12x, sglang-queue-collapse 1.69x/1.54x, and on sglang-cpu-tiny a batch of 16 against
    4, 1.99x/1.80x. Replayed over the latter's samples' time-adjacent pairs (6-24 pairs), the
    rest of an A/A stayed below 1.18x in 99% of draws, an honest 1.3x/1.25x was flagged in at
    most 0.35%, a starved baseline at 1.6x/1.01x in at least 99.5% and 1.5x/1.09x in at least
    96%."""
    if shared is None or shared.speedup <= 0:
        return None
    rest = gain / shared.speedup
    if rest <= UNSHARED_LIMIT or rest <= shared.speedup:
        return None
    metric, name = manifest.metric.name, manifest.metric.companion
    return (
        f"{metric} {gain:.2f}x but {name} {shared.speedup:.2f}x: {rest:.2f}x of the "
        f"gain is not in {name} (more than {UNSHARED_LIMIT:g}x and more than its own gain; for "
        "a server, that much more CPU per second than the baseline's: a baseline kept idle or "
        "work spread over more cores): needs a human look"
    )
