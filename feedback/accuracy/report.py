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


class ProbeResult(BaseModel):
    name: str
    diff: TensorDiff
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

    def render(self, max_probes: int = 8) -> str:
        lines = [f"{self.verdict}: " + "; ".join(self.reasons)]
        if self.first_divergence:
            worst = ", ".join(f"{idx}: {v:.3g}" for idx, v in self.worst_positions)
            lines.append(f"first divergence: {self.first_divergence} (worst positions {worst})")
        shown = self.probes
        if len(shown) > max_probes and self.first_divergence:
            i = [p.name for p in shown].index(self.first_divergence)
            lo = max(0, min(i - 2, len(shown) - max_probes))
            shown = shown[lo : lo + max_probes]
        for p in shown[:max_probes]:
            d = p.diff
            line = (
                f"{'x' if d.violations else '.'} {p.name}: rel {d.rel_diff:.2e} max {d.max_abs:.3g}"
                f"@{d.max_abs_at} sqnr {d.sqnr_db:.1f}dB viol {d.violations}/{d.numel}"
            )
            if d.max_ulp is not None:
                line += f" ulp {d.max_ulp:.3g}"
            if d.nonfinite:
                line += f" nonfinite {d.nonfinite}"
            if p.candidate_err_f64 is not None:
                line += (
                    f" f64err b {p.baseline_err_f64:.2e} c {p.candidate_err_f64:.2e} ({p.blame})"
                )
            if p.self_rel_diff is not None:
                line += f" self {p.self_rel_diff:.2e} inherited {p.inherited_share:.0%}"
            lines.append(line)
        if len(self.probes) > len(shown):
            lines.append(f"({len(self.probes) - len(shown)} more probes)")
        if self.only_in_baseline or self.only_in_candidate:
            lines.append(
                f"missing in candidate: {self.only_in_baseline[:5]}; "
                f"extra in candidate: {self.only_in_candidate[:5]}"
            )
        return "\n".join(lines)


def _blame(base_err: float, cand_err: float, atol: float, multiplier: float) -> str:
    cand_ok = cand_err <= multiplier * base_err + atol / 10
    base_ok = base_err <= multiplier * cand_err + atol / 10
    if cand_ok and base_ok:
        return "neither" if max(base_err, cand_err) <= atol else "both"
    return "baseline" if cand_ok else "candidate"


def _rmse(x: torch.Tensor, ref: torch.Tensor) -> float:
    return tensor_diff(ref, x, rtol=0.0, atol=0.0).rmse


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
) -> AccuracyReport:
    """Probe-by-probe comparison of two paths; see the module docstring."""
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
            result.baseline_err_f64 = _rmse(a, ref)
            result.candidate_err_f64 = _rmse(b, ref)
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
    return report


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
    worst = max(bad, key=lambda p: p.diff.rel_diff if math.isfinite(p.diff.rel_diff) else 1.0)
    report.reasons.append(
        f"{len(bad)}/{len(report.probes)} probes out of tolerance, first {report.first_divergence},"
        f" worst {worst.name} (rel {worst.diff.rel_diff:.2e})"
    )
    if has_ref and not cand_worse and report.verdict != "FAIL":
        report.verdict = "PRECISION_FLOOR"
        report.reasons.append("candidate no further from float64 than baseline at every probe")
    else:
        report.verdict = "FAIL"
        if has_ref:
            blamed = [p.name for p in report.probes if p.blame == "candidate"]
            report.reasons.append(f"candidate worse than baseline vs float64 at {blamed[:3]}")
