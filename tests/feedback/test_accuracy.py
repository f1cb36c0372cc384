"""Accuracy diff: injected divergence found, self vs inherited error, f64 attribution, growth."""

import math
from pathlib import Path

import pytest
import torch

from infra_agent.errors import UserError
from infra_agent.feedback.accuracy import (
    capture,
    compare_paths,
    error_sweep,
    load_dump,
    probe,
    save_dump,
    tensor_diff,
)

W = [torch.randn(16, 16, generator=torch.Generator().manual_seed(i)) / 4 for i in range(5)]


def stage(i: int, x: torch.Tensor, broken: bool = False) -> torch.Tensor:
    y = torch.tanh(x @ W[i])
    if broken:  # the injected bug: token 5 of stage 3 is corrupted
        y = y.clone()
        y[5] += 0.05
    return y


def pipeline(x: torch.Tensor, broken_stage: int | None = None) -> torch.Tensor:
    for i in range(5):
        x = probe(f"stage{i}", stage(i, x, broken=i == broken_stage))
    return x


def test_finds_injected_first_divergence_and_separates_self_from_inherited() -> None:
    x = torch.randn(12, 16, generator=torch.Generator().manual_seed(7))
    with capture() as base:
        pipeline(x)
    with capture() as cand:
        pipeline(x, broken_stage=3)
    stages = {f"stage{i}": (lambda t, i=i: stage(i, t, broken=i == 3)) for i in range(1, 5)}
    report = compare_paths(base, cand, stages=stages)
    assert list(base) == [f"stage{i}" for i in range(5)]
    assert report.verdict == "FAIL"
    assert report.first_divergence == "stage3"
    assert report.worst_positions[0][0] == [5]
    by_name = {p.name: p for p in report.probes}
    assert by_name["stage2"].diff.violations == 0
    assert by_name["stage3"].diff.max_abs_at[0] == 5
    # stage3 made its error itself; stage4 only inherited it.
    assert by_name["stage3"].inherited_share == pytest.approx(0.0, abs=1e-6)
    assert by_name["stage4"].self_rel_diff == pytest.approx(0.0, abs=1e-12)
    assert by_name["stage4"].inherited_share == pytest.approx(1.0)
    text = report.render()
    assert text.startswith("FAIL") and "first divergence: stage3" in text


def test_float64_reference_attributes_the_error() -> None:
    g = torch.Generator().manual_seed(0)
    ref = {"out": torch.randn(1000, dtype=torch.float64, generator=g)}
    noise = lambda s: torch.randn(1000, dtype=torch.float64, generator=g) * s  # noqa: E731
    base = {"out": (ref["out"] + noise(1e-4)).float()}
    same_quality = {"out": (ref["out"] + noise(1e-4)).float()}
    worse = {"out": (ref["out"] + noise(1e-2)).float()}
    floor = compare_paths(base, same_quality, reference=ref)
    assert floor.verdict == "PRECISION_FLOOR"
    assert floor.probes[0].blame == "both"
    fail = compare_paths(base, worse, reference=ref)
    assert fail.verdict == "FAIL" and fail.probes[0].blame == "candidate"
    assert compare_paths(base, {"out": base["out"].clone()}).verdict == "PASS"


def test_module_hooks_capture_in_execution_order(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    with capture(model) as base:
        model(x)
    assert list(base) == ["0", "1", "2"]
    with torch.no_grad():
        model[2].weight[1, 0] += 1.0
    with capture(model) as cand:
        model(x)
    save_dump(cand, tmp_path / "cand")
    loaded = load_dump(tmp_path / "cand")
    assert list(loaded) == ["0", "1", "2"]
    report = compare_paths(base, loaded)
    assert report.first_divergence == "2"
    assert report.probes[-1].diff.max_abs_at[1] == 1


def test_reduced_precision_chunked_sum_grows_super_linearly() -> None:
    def chunked_sum(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        chunk_sums = x.reshape(-1, 64).sum(dim=1)
        state = torch.zeros((), dtype=dtype)
        states = []
        for s in chunk_sums:  # the state carried across chunks is kept in `dtype`
            state = state + s.to(dtype)
            states.append(state)
        return torch.stack(states).double(), chunk_sums.cumsum(0)

    sizes = [1024, 2048, 4096, 8192, 16384]
    low = error_sweep(lambda n: chunked_sum(n, torch.float16), sizes)
    assert low.growth == "super-linear"
    assert low.slope_max_abs > 1.1
    assert all(b.max_abs > a.max_abs for a, b in zip(low.points, low.points[1:], strict=False))
    exact = error_sweep(lambda n: chunked_sum(n, torch.float64), sizes)
    assert exact.points[-1].max_abs < 1e-9
    assert "super-linear" in low.render()


def test_tensor_diff_chunking_and_non_finite_values() -> None:
    g = torch.Generator().manual_seed(1)
    a = torch.randn(50, 7, generator=g)
    b = a + torch.randn(50, 7, generator=g) * 1e-3
    whole, chunked = tensor_diff(a, b), tensor_diff(a, b, chunk=11)
    assert chunked.max_abs == whole.max_abs and chunked.max_abs_at == whole.max_abs_at
    a64, b64 = a.double(), b.double()
    exact = float(1 - 2 * (a64 * b64).sum() / (a64.square() + b64.square()).sum())
    assert math.isclose(chunked.rel_diff, exact, rel_tol=1e-5)
    assert math.isclose(whole.rel_diff, exact, rel_tol=1e-5)
    assert whole.max_abs == pytest.approx(float((a - b).abs().max()))
    a[0, 0] = b[0, 0] = float("-inf")  # equal infinities are equal (attention masks)
    b[3, 3] = float("nan")
    d = tensor_diff(a, b, chunk=16)
    assert d.nonfinite == 1 and d.max_abs_at == [3, 3] and math.isinf(d.max_abs)
    with pytest.raises(UserError, match="shape mismatch"):
        tensor_diff(a, b[:3])
