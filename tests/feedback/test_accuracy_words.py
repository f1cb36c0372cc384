"""Accuracy in plain words: relative RMS and max error against float64 and against each other,
the experiment's rule with 'would pass'/'would fail', ULPs only where meaningful, and the
relative slope of a size sweep."""

from __future__ import annotations

import re

import pytest
import torch

from infra_agent.feedback.accuracy import ToleranceRule, compare_paths, error_sweep, tensor_diff

RULE = ToleranceRule(atol=1e-5, rtol=1e-4, f64_factor=2.0, f64_floor=1e-6, source="task t")
"""decode-split-norm's tolerance: element-wise atol/rtol, max abs vs float64 within 2x."""


def _paths(rel_noise: float) -> tuple[dict, dict, dict]:
    """A float64 reference, its float32 rounding (the baseline), and a candidate whose error
    against the baseline is `rel_noise` relative RMS."""
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 256, generator=g, dtype=torch.float64)
    base = ref.float()
    noise = torch.randn(base.shape, generator=g)
    cand = base + rel_noise * base.pow(2).mean().sqrt() * noise
    return {"out": base}, {"out": cand}, {"out": ref}


def test_a_candidate_one_percent_off_would_fail_with_its_relative_rms_in_words() -> None:
    base, cand, ref = _paths(1e-2)
    report = compare_paths(base, cand, reference=ref, rule=RULE)
    expected = float((cand["out"] - base["out"]).norm() / base["out"].norm())
    probe = report.probes[0]
    assert probe.diff.rel_rms == pytest.approx(expected, rel=1e-6)
    assert 0.0098 < expected < 0.0102  # about 1e-2, as injected
    assert probe.diff.rel_diff < 1e-4  # the energy ratio would read 200x smaller
    text = report.render()
    assert report.would_pass is False and text.startswith("would fail")
    assert f"candidate vs baseline rel RMS {expected:.2e}" in text
    cand_f64 = probe.candidate_vs_f64
    base_f64 = probe.baseline_vs_f64
    assert cand_f64 is not None and base_f64 is not None
    assert cand_f64.rel_rms == pytest.approx(expected, rel=0.01) and base_f64.rel_rms < 1e-7
    assert f"vs float64: candidate rel RMS {cand_f64.rel_rms:.2e}" in text
    assert f"baseline rel RMS {base_f64.rel_rms:.2e}" in text
    assert "1e-05 + 0.0001·|baseline|" in text and "max(2 x baseline's, 1e-06)" in text
    assert len(text) < 1500
    # The record keeps every number.
    dumped = report.model_dump()
    assert dumped["rule"]["rtol"] == 1e-4 and dumped["probes"][0]["diff"]["max_rel"] > 0


def test_float32_rounding_differences_would_pass_and_float64_factor_decides_alone() -> None:
    base, _, ref = _paths(0.0)
    cand = {"out": (base["out"] * 3.0) / 3.0}  # a few float32 ulps at most
    report = compare_paths(base, cand, reference=ref, rule=RULE)
    assert report.would_pass is True and report.render().startswith("would pass")
    # Only the float64 rule (no element-wise part, as in tasks checking against float64 only):
    f64_only = ToleranceRule(atol=None, rtol=None, f64_factor=1.5, f64_floor=0.0, source="t")
    _, far, _ = _paths(1e-3)
    verdict = compare_paths(base, far, reference=ref, rule=f64_only)
    assert verdict.would_pass is False
    assert "max abs error vs float64" in verdict.rule_failures[0]
    assert "outside tolerance" not in " ".join(verdict.rule_failures)


def test_ulps_are_marked_when_values_near_zero_inflate_them() -> None:
    base = torch.tensor([1.0, 2.0, 1e-30, 4.0])
    near_zero = tensor_diff(base, base + torch.tensor([0.0, 0.0, 1e-7, 0.0]))
    text = compare_paths({"x": base}, {"x": base + torch.tensor([0.0, 0.0, 1e-7, 0.0])}).render()
    assert near_zero.max_ulp is not None and near_zero.max_ulp > 1e20
    assert "max ULP left out at 1 probes: baseline values near zero inflate it" in text
    one_ulp = base.clone()
    one_ulp[3] = torch.nextafter(base[3], torch.tensor(10.0))
    plain = compare_paths({"x": base}, {"x": one_ulp}).render()
    assert re.search(r"; max ULP 1\b", plain) and "left out" not in plain
    assert "ULP" not in compare_paths({"x": base}, {"x": base.clone()}).render()


def test_sweep_reports_the_slope_of_relative_error_beside_the_absolute_one() -> None:
    def run(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        ref = torch.full((64,), float(size), dtype=torch.float64)  # values grow with size
        return ref * (1 + 1e-6), ref  # a constant relative error

    report = error_sweep(run, [256, 1024, 4096])
    assert report.slope_max_abs == pytest.approx(1.0, abs=0.01) and report.growth == "linear"
    assert abs(report.slope_rel_rms) < 0.01 and report.rel_growth == "flat"
    assert all(p.rel_rms == pytest.approx(1e-6, rel=1e-3) for p in report.points)
    text = report.render()
    assert "linear in absolute terms" in text and "flat in relative terms" in text
    assert "relative RMS error by size: 256: 1.00e-06" in text
