"""The typed outcome of an experiment: a `Verdict`, the reasons in plain words, and the `Evidence`.

This is the contract between the verification cascade, the run store, the review queue, the
agent's tools and the dataset exports. Every number that decided a verdict is in here.
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

EVIDENCE_SCHEMA_VERSION = 1


class _Record(BaseModel):
    # A measurement can be NaN or infinite (a zero baseline): kept as JSON's NaN / Infinity
    # constants so that the record reads back (pydantic would write null, which a float refuses).
    model_config = ConfigDict(ser_json_inf_nan="constants")


class Verdict(str, Enum):
    IMPROVED = "IMPROVED"
    """Better than baseline on the task's metric, with a confidence interval excluding no-change."""
    NO_CHANGE = "NO_CHANGE"
    """Within noise."""
    REGRESSED = "REGRESSED"
    """Worse than baseline, with confidence."""
    INCORRECT = "INCORRECT"
    """Output wrong against the reference or less accurate than baseline against float64."""
    FAILED = "FAILED"
    """Crash, timeout or resource limit: the candidate could not be measured."""
    REJECTED = "REJECTED"
    """A rule was broken (patch outside editable files, forbidden construct, sandbox escape)."""


class Flag(str, Enum):
    SUSPICIOUS = "suspicious"
    """Speedup above the task's plausibility bound or other oddity: forces human review."""
    NOISY = "noisy"
    """The measurement was noisy (high IQR, drift); the verdict is less certain."""
    ACCURACY_NEAR_THRESHOLD = "accuracy_near_threshold"
    """Correct, but within 20% of the tolerance."""
    HEALTH_WARNING = "health_warning"
    """The output-health guard fired more often than on baseline (serving targets)."""
    DIFFERENT_NODES = "different_nodes"
    """Baseline and candidate were measured on different machines."""
    BASELINE_FAILED = "baseline_failed"
    """FAILED because the baseline arm failed (its server did not start, it timed out or
    crashed): the verdict says nothing about the patch, which may be measured again."""
    UNDERPOWERED = "underpowered"
    """NO_CHANGE from a measurement that could not resolve the effect asked for (budget or
    noise): it rules out only larger changes."""


class CorrectnessEvidence(_Record):
    passed: bool
    checks: int = 0
    """How many fresh inputs were checked."""
    max_abs_err: float | None = None
    """Max |candidate - reference| over all checks."""
    max_rel_err: float | None = None
    tolerance: str | None = None
    """The tolerance applied, in words (e.g. 'atol=1e-5 rtol=1.3e-6 (float32)')."""
    baseline_err_f64: float | None = None
    """Baseline's error against the float64 reference (task's error measure)."""
    candidate_err_f64: float | None = None
    """Candidate's error against the float64 reference."""
    detail: str | None = None
    """First failing check, in words."""
    compared: str | None = None
    """What the check compared, against what (e.g. 'the decode output against the harness's
    float32 reference'; a likelihood test also its outcome), from the first check that said."""


class StopReason(str, Enum):
    """Why the performance stage stopped sampling."""

    RESOLVED = "resolved"
    """The interval reached the precision asked for (a rate metric: the difference was shown)
    and every constraint was shown either way."""
    MAX_SAMPLES = "max_samples"
    """The budget's `max_samples` pairs were taken first."""
    TIME_BUDGET = "time_budget"
    """The budget's `measure_budget_s` ran out first."""


class PerformanceEvidence(_Record):
    metric: str
    """e.g. 'latency_ms' or 'output_throughput'."""
    unit: str
    """e.g. 'ms' or 'tok/s'."""
    higher_is_better: bool
    baseline_median: float
    candidate_median: float
    speedup: float
    """Improvement factor oriented so that > 1 is better (baseline/candidate for times and
    errors); what it is called is `gain`."""
    ci_low: float
    """95% confidence interval of `speedup`."""
    ci_high: float
    n_samples: int
    """Samples per arm."""
    baseline_samples: list[float] = Field(default_factory=list)
    candidate_samples: list[float] = Field(default_factory=list)
    noise: list[str] = Field(default_factory=list)
    """Noise flags from the benchmark instrument (e.g. 'high_iqr', 'drift')."""
    min_effect: float | None = None
    """The task's minimum effect (relative) the decision used; None in records made before it
    was kept here."""
    gain: str = "speedup"
    """What the factor is: 'speedup' (time, throughput), 'error ratio' (accuracy tasks: baseline
    error / candidate error), 'rate ratio' (rare events: baseline rate / candidate rate)."""
    method: str = ""
    """How it was measured (interleaving, bootstrap, repetitions)."""
    pair_noise: float | None = None
    """sd of the log per-pair speedups: the noise one pair of samples carries (0.03 = 3%)."""
    detectable_effect: float | None = None
    """Smallest speedup this measurement finds IMPROVED with 80% probability (e.g. 1.07)."""
    wanted_effect: float | None = None
    """The detectable effect asked for (the task's precision, or the caller's `detect`)."""
    calibration: str = ""
    """What the experiment said after its calibration, before the bulk of the samples."""
    pairs_needed: int | None = None
    """Pairs (samples/arm) the wanted effect needs, scaled from this interval's width, when it
    was not resolved (None: resolved, or no sample count reaches it)."""
    stopped: StopReason | None = None
    """Why sampling stopped (None in records made before it was kept)."""
    all_samples: dict[str, dict[str, list[float]]] = Field(default_factory=dict)
    """Arm ('baseline', 'candidate') -> every sample key the harness returned -> values, in
    measurement order: what an extension continues from."""
    extended_from: str | None = None
    """The experiment whose pairs this one continued (an extension of an unresolved NO_CHANGE
    on the same arms), else None."""
    reused_pairs: int = 0
    """Pairs taken over from `extended_from` (counted in `n_samples`)."""

    def summary(self) -> dict[str, Any]:
        """The decisive numbers without the samples: the gain with its 95% interval, the
        medians and the pairs (what `infra-agent experiment --json` shows at its top)."""
        head = self.model_dump(mode="json", include=SUMMARY_FIELDS)
        n_samples = head.pop("n_samples")  # last, after the interval's level
        return head | {"confidence": 0.95, "n_samples": n_samples}

    @field_validator(
        "baseline_median", "candidate_median", "speedup", "ci_low", "ci_high", mode="before"
    )
    @classmethod
    def _null_is_nan(cls, value: Any) -> Any:
        """A NaN an earlier version stored as null reads back as NaN."""
        return math.nan if value is None else value


SUMMARY_FIELDS = {
    "metric", "unit", "higher_is_better", "baseline_median", "candidate_median", "speedup",
    "ci_low", "ci_high", "n_samples",
}  # fmt: skip
"""The fields of `PerformanceEvidence.summary` (with `confidence`: the interval's level)."""


class SandboxEvidence(_Record):
    backend: str
    """'local' or 'docker'."""
    isolation: list[str] = Field(default_factory=list)
    """Isolation actually in force, e.g. ['netns:bwrap', 'rlimit:as', 'env:scrubbed']."""
    missing: list[str] = Field(default_factory=list)
    """Isolation that was asked for but could not be applied."""


class Evidence(_Record):
    schema_version: int = EVIDENCE_SCHEMA_VERSION
    stage_reached: str = ""
    """Last cascade stage run: apply, static, correctness, performance, health."""
    correctness: CorrectnessEvidence | None = None
    performance: PerformanceEvidence | None = None
    health: dict[str, float | int | str | bool] = Field(default_factory=dict)
    """Task health checks (e.g. corruption counts, guard trips), name -> value."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """Any other task metric measured, name -> value (units in the name)."""
    rule_violations: list[str] = Field(default_factory=list)
    sandbox: SandboxEvidence | None = None
    durations_s: dict[str, float] = Field(default_factory=dict)
    """Wall time per cascade stage, seconds."""
    log_tail: str = ""
    """Last lines of the candidate's stderr when it failed."""
    extra: dict[str, object] = Field(default_factory=dict)
    """Task-specific evidence (e.g. accuracy divergence point); rendered as JSON if unknown."""
    params: dict[str, Any] = Field(default_factory=dict)
    """The task parameters both arms ran with (defaults and overrides resolved)."""


class ExperimentResult(_Record):
    """The outcome of one experiment: what the CLI prints with --json and the store records."""

    schema_version: int = EVIDENCE_SCHEMA_VERSION
    task: str
    patch_id: str
    verdict: Verdict
    reasons: list[str]
    flags: list[Flag] = Field(default_factory=list)
    evidence: Evidence = Field(default_factory=Evidence)

    def render(self) -> str:
        """A short rendering for a model or a person, the decisive numbers first and each once:
        the verdict with its gain, interval and medians; the reasons (words, and the numbers
        only they carry: resolution, noise, companion); what the correctness check compared;
        health in one line when clean. The calibration and every sample stay in the record."""
        flags = f" [{', '.join(f.value for f in self.flags)}]" if self.flags else ""
        perf = self.evidence.performance
        head = f"{self.verdict.value}{flags}"
        overruled = any(r.startswith(SIGN_OVERRULED) for r in self.reasons)
        lines = [head + (f": {_headline(perf, overruled)}" if perf is not None else "")]
        lines.extend(f"- {r}" for r in self.reasons)
        corr = self.evidence.correctness
        if corr is not None:
            lines.append(_correctness_line(corr))
        if self.evidence.health and Flag.HEALTH_WARNING not in self.flags:
            lines.append(_clean_health_line(self.evidence.health))
        return "\n".join(lines)


UNBOUNDED = 1e6
"""An improvement factor at or above this is shown as unbounded (a rate metric whose candidate
saw no event)."""


SIGN_OVERRULED = "not shown: the sign test's"
"""How a reason starts when the sign test overruled the bootstrap interval (judgement.decision)."""


_STOPPED_SHORT = {
    StopReason.MAX_SAMPLES: "the budget's max_samples",
    StopReason.TIME_BUDGET: "the budget's measure_budget_s",
}
"""What ended sampling before the interval resolved what was asked, as the headline says it."""


def _headline(perf: PerformanceEvidence, overruled: bool = False) -> str:
    """The gain, its 95% interval, the pairs it rests on and the metric's medians; an interval
    the sign test overruled says so, since it alone would read as a change."""
    high = "unbounded" if perf.ci_high >= UNBOUNDED else f"{perf.ci_high:.3f}"
    interval = f"95% CI {perf.ci_low:.3f}-{high}"
    if overruled:
        interval = f"bootstrap {interval}, overruled by the sign test below"
    pairs = f"n={perf.n_samples}/arm"
    if perf.extended_from is not None:
        pairs += f", {perf.reused_pairs} of them reused from {perf.extended_from} (extended)"
    if perf.stopped in _STOPPED_SHORT:  # a relay model asked why an extension took 22, not 24
        pairs += f"; sampling stopped at {_STOPPED_SHORT[perf.stopped]}"
    medians = f"{perf.metric} median {perf.baseline_median:.4g} -> {perf.candidate_median:.4g} {perf.unit}"  # fmt: skip
    b, c = perf.baseline_median, perf.candidate_median
    of_medians = (c / b if perf.higher_is_better else b / c) if b > 0 and c > 0 else math.nan
    paired = "per-pair ratios (paired" in perf.method
    if paired and math.isfinite(of_medians) and abs(of_medians / perf.speedup - 1) > 0.02:
        # A relay run read 1.42x beside medians 1156 -> 1271 as a contradiction.
        medians += (
            f" (their ratio {of_medians:.3f}x; the gain is the median of the per-pair ratios, "
            "each pair measured back to back)"
        )
    return f"{perf.gain} {perf.speedup:.3f}x ({interval}, {pairs}); {medians}"


def _correctness_line(corr: CorrectnessEvidence) -> str:
    """What was compared, against what and by which rule; the errors when it passed (a failure's
    numbers are in the reason that names it)."""
    what = corr.compared or "the candidate's output against the harness's reference"
    inputs = f"{corr.checks} fresh input{'' if corr.checks == 1 else 's'}"
    line = f"correctness {'pass' if corr.passed else 'FAIL'} on {inputs}: {what}"
    if corr.tolerance:
        line += f" (rule: {corr.tolerance})"
    if not corr.passed:
        return line
    numbers = []
    if corr.max_abs_err is not None:
        numbers.append(f"max abs err {corr.max_abs_err:.3g}")
    if corr.candidate_err_f64 is not None and corr.baseline_err_f64 is not None:
        numbers.append(
            f"error vs float64 {corr.candidate_err_f64:.3g} (baseline {corr.baseline_err_f64:.3g})"
        )
    return line + "".join(f"; {n}" for n in numbers)


def _clean_health_line(health: dict[str, float | int | str | bool]) -> str:
    """Health when no rule was tripped more often than on baseline, in one line (the output
    counts and the likelihood judgement when the harness reports them)."""
    said = []
    if "candidate_outputs" in health and "candidate_unhealthy" in health:
        said.append(
            f"{health['candidate_unhealthy']}/{health['candidate_outputs']} candidate outputs "
            f"unhealthy (baseline {health.get('baseline_unhealthy', '?')}/"
            f"{health.get('baseline_outputs', '?')})"
        )
    if "likelihood_z" in health and "likelihood_pairs" in health:
        said.append(
            "outputs as likely as baseline's under the baseline server "
            f"(signed-rank z {health['likelihood_z']}, {health['likelihood_pairs']} prompts)"
        )
    return "health: clean" + (f": {'; '.join(said)}" if said else " (no rule worse than baseline)")
