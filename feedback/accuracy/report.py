"""Compare two execution paths probe by probe: `compare_paths(baseline, candidate, ...)`.

Inputs are ordered dicts name -> tensor (from `capture()` or `load_dump()`), in execution order
(the baseline's order decides). Optional:
- `reference`: the same probes from a float64 path. Each path's RMSE against it is reported and
  the attribution rule of PyTorch dynamo's `same()` decides who is wrong: the candidate is no
  worse when rmse(candidate, ref) <= multiplier · rmse(baseline, ref) + atol/10.
- `stages`: probe name -> the candidate's stage as a callable taking that stage's input. The
  stage is re-run on the *baseline's* input (the previous probe's baseline tensor, or
  `stage_inputs[name]`), which separates the error the stage adds itself from the error it
  inherits from earlier stages.

Verdict: PASS when every common probe is within tolerance (assert_close defaults per dtype
unless `rtol`/`atol` are given); PRECISION_FLOOR when they differ but, with a float64
reference, the candidate is no worse than the baseline at every probe (both equally far from
float64); FAIL otherwise (or when probes are missing on one side).

`rule`: the accuracy rule an experiment applies (`ToleranceRule`, e.g. from a task's
tolerance): element-wise atol + rtol·|baseline|, and against float64 the candidate's error at
most `f64_factor` times the baseline's (or below `f64_floor`). The report then says whether the
candidate `would_pass` it, and why not. Errors are shown in plain words: relative RMS error and
max error relative to the largest value, candidate and baseline against float64 and against each
other; ULP counts only where they are not inflated by values near zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel, Field

from infra_agent.errors import UserError
from infra_agent.feedback.accuracy.metrics import TensorDiff, tensor_diff, worst_positions

AccuracyVerdict = Literal["PASS", "FAIL", "PRECISION_FLOOR"]
DYNAMO_MULTIPLIER = 2.0
"""dynamo same(): candidate error against float64 may be this many times the baseline's."""


F64Error = Literal["max_abs", "rel_rms", "max_rel"]


class ErrorSize(BaseModel):
    """How far one tensor is from a reference, in plain numbers."""

    rel_rms: float
    """sqrt(Σ(x - ref)²/Σref²): relative RMS error."""
    max_rel: float
    """max|x - ref| / max|ref|."""
    max_abs: float
    rmse: float

    @classmethod
    def of(cls, d: TensorDiff) -> ErrorSize:
        return cls(rel_rms=d.rel_rms, max_rel=d.max_rel, max_abs=d.max_abs, rmse=d.rmse)

    def measure(self, kind: F64Error) -> float:
        return float(getattr(self, kind))

    def words(self) -> str:
        return f"rel RMS {self.rel_rms:.2e}, max rel {self.max_rel:.2e}"


class ToleranceRule(BaseModel):
    """The accuracy rule an experiment applies, as numbers (see the module docstring)."""

    atol: float | None
    """Element-wise: |candidate - baseline| <= atol + rtol·|baseline| (None with rtol None: no
    element-wise part)."""
    rtol: float | None
    f64_factor: float | None = None
    """Candidate error vs float64 may be this many times the baseline's (None: no such rule)."""
    f64_floor: float = 0.0
    """Errors vs float64 at or below this always pass."""
    f64_error: F64Error = "max_abs"
    """Which error against float64 the factor compares."""
    source: str = "assert_close defaults"
    """Where the rule comes from, in words (e.g. 'task decode-split-norm')."""

    def render(self) -> str:
        parts = []
        if self.elementwise:
            parts.append(
                f"|candidate - baseline| <= {self.atol or 0:g} + {self.rtol or 0:g}·|baseline| "
                "at every element"
            )
        if self.f64_factor is not None:
            parts.append(
                f"{self.f64_error.replace('_', ' ')} error vs float64 <= max({self.f64_factor:g}"
                f" x baseline's, {self.f64_floor:g})"
            )
        return f"{'; '.join(parts) or 'none'} ({self.source})"

    @property
    def elementwise(self) -> bool:
        return self.atol is not None or self.rtol is not None


class ProbeResult(BaseModel):
    name: str
    diff: TensorDiff
    baseline_vs_f64: ErrorSize | None = None
    """The baseline's error against the float64 reference."""
    candidate_vs_f64: ErrorSize | None = None
    baseline_err_f64: float | None = None
    """RMSE of the baseline against the float64 reference."""
    candidate_err_f64: float | None = None
    blame: Literal["candidate", "baseline", "both", "neither"] | None = None
    """Who is off the float64 reference (only with a reference)."""
    self_rel_diff: float | None = None
    """Stage re-run on the baseline's input vs the baseline's output: error the stage adds."""
    self_max_abs: float | None = None
    inherited_share: float | None = None
    """1 - self/total of the rel diff: how much of this probe's error came from upstream."""


class AccuracyReport(BaseModel):
    verdict: AccuracyVerdict
    probes: list[ProbeResult] = Field(default_factory=list)
    """Common probes in execution order."""
    first_divergence: str | None = None
    """First probe out of tolerance, in execution order."""
    worst_positions: list[tuple[list[int], float]] = Field(default_factory=list)
    """At the first divergence: (index over the leading dim, max |diff|), worst first."""
    only_in_baseline: list[str] = Field(default_factory=list)
    only_in_candidate: list[str] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    rule: ToleranceRule | None = None
    """The experiment's accuracy rule the report was judged against (None: none given)."""
    would_pass: bool | None = None
    """Whether the candidate would pass `rule` (None without a rule)."""
    rule_failures: list[str] = Field(default_factory=list)
    """Why it would fail, one line per broken part of the rule."""

    def render(self, max_probes: int = 8) -> str:
        lines = []
        if self.rule is not None:
            if self.would_pass:
                lines.append("would pass the experiment's accuracy rule")
            else:
                lines.append(
                    "would fail the experiment's accuracy rule: "
                    + "; ".join(self.rule_failures[:3])
                )
            lines.append(f"rule: {self.rule.render()}")
        # The probes' own tolerance is not the rule above: say so, or the two read as one
        # contradicting verdict ('would pass' beside 'FAIL 822/16384 outside tolerance').
        beside = (
            "elementwise check (the tolerance below, not the rule above): " if self.rule else ""
        )
        lines.append(f"{beside}{self.verdict}: " + "; ".join(self.reasons))
        if self.first_divergence:
            worst = ", ".join(f"{idx}: {v:.3g}" for idx, v in self.worst_positions)
            lines.append(f"first divergence: {self.first_divergence} (worst positions {worst})")
        shown = self.probes
        if len(shown) > max_probes and self.first_divergence:
            i = [p.name for p in shown].index(self.first_divergence)
            lo = max(0, min(i - 2, len(shown) - max_probes))
            shown = shown[lo : lo + max_probes]
        for p in shown[:max_probes]:
            lines.extend(_probe_lines(p))
        if self.probes:
            d = self.probes[0].diff
            lines.append(
                f"(tolerance |error| <= {d.atol:g} + {d.rtol:g}·|baseline|; rel RMS = RMS(error)"
                " / RMS(reference); max rel = max |error| / max |reference|)"
            )
        inflated = sum(_ulp_inflated(p.diff) for p in self.probes)
        if inflated:
            lines.append(
                f"max ULP left out at {inflated} probes: baseline values near zero inflate it"
            )
        if len(self.probes) > len(shown):
            lines.append(f"({len(self.probes) - len(shown)} more probes)")
        if self.only_in_baseline or self.only_in_candidate:
            lines.append(
                f"missing in candidate: {self.only_in_baseline[:5]}; "
                f"extra in candidate: {self.only_in_candidate[:5]}"
            )
        return "\n".join(lines)


def _probe_lines(p: ProbeResult) -> list[str]:
    d = p.diff
    mark = "x" if d.violations else "."
    line = (
        f"{mark} {p.name} {d.dtypes[1]}{d.shape}: candidate vs baseline "
        f"{ErrorSize.of(d).words()} (max |err| {d.max_abs:.3g} at {d.max_abs_at}: "
        f"{d.baseline_at_max:.4g} -> {d.candidate_at_max:.4g}); "
        f"{d.violations}/{d.numel} outside tolerance"
    )
    if _ulp_meaningful(d):
        line += f"; max ULP {d.max_ulp:.3g}"
    if d.nonfinite:
        line += f"; {d.nonfinite} NaN/inf"
    lines = [line]
    if p.candidate_vs_f64 is not None and p.baseline_vs_f64 is not None:
        c, b = p.candidate_vs_f64, p.baseline_vs_f64
        lines.append(
            f"  vs float64: candidate {c.words()}; baseline {b.words()} (off float64: {p.blame})"
        )
    if p.self_rel_diff is not None:
        lines.append(
            f"  added by this stage: rel diff {p.self_rel_diff:.2e}, "
            f"{p.inherited_share:.0%} inherited from upstream"
        )
    return lines


def _ulp_inflated(d: TensorDiff) -> bool:
    """The ULP count implies a relative error far above the normwise max relative error: it is
    dominated by baseline values near zero, where ULPs are tiny."""
    if d.max_ulp is None or d.max_abs == 0 or not math.isfinite(d.max_ulp):
        return False
    eps = max(_eps_of(name) for name in d.dtypes)
    return eps > 0 and d.max_ulp * eps > 10 * max(d.max_rel, eps)


def _ulp_meaningful(d: TensorDiff) -> bool:
    finite = d.max_ulp is not None and math.isfinite(d.max_ulp)
    return finite and d.max_abs > 0 and not _ulp_inflated(d)


def _eps_of(name: str) -> float:
    dtype = getattr(torch, name, None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return float(torch.finfo(dtype).eps)
    return 0.0


def _blame(base_err: float, cand_err: float, atol: float, multiplier: float) -> str:
    cand_ok = cand_err <= multiplier * base_err + atol / 10
    base_ok = base_err <= multiplier * cand_err + atol / 10
    if cand_ok and base_ok:
        return "neither" if max(base_err, cand_err) <= atol else "both"
    return "baseline" if cand_ok else "candidate"


def compare_paths(
    baseline: dict[str, torch.Tensor],
    candidate: dict[str, torch.Tensor],
    *,
    reference: dict[str, torch.Tensor] | None = None,
    stages: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None,
    stage_inputs: dict[str, str] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    multiplier: float = DYNAMO_MULTIPLIER,
    position_dims: int = 1,
    rule: ToleranceRule | None = None,
) -> AccuracyReport:
    """Probe-by-probe comparison of two paths; see the module docstring. With `rule`, its
    atol/rtol replace `atol`/`rtol` and the report says whether the candidate would pass it."""
    if rule is not None and rule.elementwise:
        rtol, atol = rule.rtol or 0.0, rule.atol or 0.0
    if not baseline or not candidate:
        raise UserError("both paths need at least one captured tensor")
    order = [n for n in baseline if n in candidate]
    if not order:
        raise UserError("baseline and candidate share no probe names")
    stages = stages or {}
    for name in stages:
        if name not in baseline:
            raise UserError(f"stage {name!r} is not a baseline probe")
    report = AccuracyReport(
        verdict="PASS",
        only_in_baseline=[n for n in baseline if n not in candidate],
        only_in_candidate=[n for n in candidate if n not in baseline],
    )
    names = list(baseline)
    cand_worse_anywhere = False
    for name in order:
        a, b = baseline[name], candidate[name]
        diff = tensor_diff(a, b, rtol=rtol, atol=atol)
        result = ProbeResult(name=name, diff=diff)
        if reference is not None and name in reference:
            ref = reference[name]
            base_ref = tensor_diff(ref, a, rtol=0.0, atol=0.0)
            cand_ref = tensor_diff(ref, b, rtol=0.0, atol=0.0)
            result.baseline_vs_f64 = ErrorSize.of(base_ref)
            result.candidate_vs_f64 = ErrorSize.of(cand_ref)
            result.baseline_err_f64 = base_ref.rmse
            result.candidate_err_f64 = cand_ref.rmse
            result.blame = _blame(  # type: ignore[assignment]
                result.baseline_err_f64, result.candidate_err_f64, diff.atol, multiplier
            )
            cand_worse_anywhere |= result.blame == "candidate"
        if name in stages:
            src = (stage_inputs or {}).get(name) or _previous(names, name)
            if src is None or src not in baseline:
                raise UserError(f"no baseline input for stage {name!r}; give stage_inputs")
            with torch.no_grad():
                own = stages[name](baseline[src].clone())
            self_diff = tensor_diff(a, own, rtol=rtol, atol=atol)
            result.self_rel_diff = self_diff.rel_diff
            result.self_max_abs = self_diff.max_abs
            total = diff.rel_diff
            result.inherited_share = (
                max(0.0, 1.0 - self_diff.rel_diff / total) if total > 0 else 0.0
            )
        report.probes.append(result)
        if report.first_divergence is None and diff.violations:
            report.first_divergence = name
            report.worst_positions = worst_positions(a, b, dims=position_dims)
    _decide(report, reference is not None, cand_worse_anywhere)
    if rule is not None:
        _judge(report, rule)
    return report


def _judge(report: AccuracyReport, rule: ToleranceRule) -> None:
    """Apply the experiment's rule: element-wise tolerance, then the float64 factor."""
    report.rule = rule
    failures = []
    if report.only_in_baseline:
        failures.append(f"{len(report.only_in_baseline)} baseline probes missing")
    for p in report.probes:
        d = p.diff
        if rule.elementwise and d.violations:
            failures.append(
                f"{p.name}: {d.violations}/{d.numel} elements outside tolerance "
                f"(candidate vs baseline {ErrorSize.of(d).words()})"
            )
        if rule.f64_factor is None or p.candidate_vs_f64 is None or p.baseline_vs_f64 is None:
            continue
        cand = p.candidate_vs_f64.measure(rule.f64_error)
        base = p.baseline_vs_f64.measure(rule.f64_error)
        limit = max(rule.f64_factor * base, rule.f64_floor)
        if not cand <= limit:
            what = rule.f64_error.replace("_", " ")
            failures.append(
                f"{p.name}: {what} error vs float64 {cand:.3g} > allowed {limit:.3g} "
                f"({rule.f64_factor:g} x baseline's {base:.3g}, floor {rule.f64_floor:g})"
            )
    report.rule_failures = failures
    report.would_pass = not failures


def _previous(names: list[str], name: str) -> str | None:
    i = names.index(name)
    return names[i - 1] if i > 0 else None


def _decide(report: AccuracyReport, has_ref: bool, cand_worse: bool) -> None:
    bad = [p for p in report.probes if p.diff.violations]
    if report.only_in_baseline:
        report.verdict = "FAIL"
        report.reasons.append(f"{len(report.only_in_baseline)} baseline probes missing")
    if not bad:
        report.reasons.append(f"all {len(report.probes)} probes within tolerance")
        return
    worst = max(bad, key=lambda p: p.diff.rel_rms if math.isfinite(p.diff.rel_rms) else 1e300)
    report.reasons.append(
        f"{len(bad)}/{len(report.probes)} probes out of tolerance, first {report.first_divergence},"
        f" worst {worst.name} (rel RMS {worst.diff.rel_rms:.2e})"
    )
    if has_ref and not cand_worse and report.verdict != "FAIL":
        report.verdict = "PRECISION_FLOOR"
        report.reasons.append("candidate no further from float64 than baseline at every probe")
    else:
        report.verdict = "FAIL"
        if has_ref:
            blamed = [p.name for p in report.probes if p.blame == "candidate"]
            report.reasons.append(f"candidate worse than baseline vs float64 at {blamed[:3]}")
