"""Accuracy diff: injected divergence found, self vs inherited error, f64 attribution, growth."""

import math
from pathlib import Path

import numpy
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


def reference_diff(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> dict:
    """The metrics of `tensor_diff`, unchunked and all in float64: the ground truth."""
    x, y = a.double().reshape(-1), b.double().reshape(-1)
    both = torch.isfinite(x) & torch.isfinite(y)
    bad = ~both & (x != y)
    x, y = torch.where(both, x, 0.0), torch.where(both, y, 0.0)
    d = (y - x).abs()
    located = torch.where(bad, math.inf, d)
    aa, bb, dd = (float(torch.square(t).sum()) for t in (x, y, d))
    n = d.numel()
    at = int(torch.argmax(located))
    return {
        "rel_diff": dd / (aa + bb),
        "mean_abs": float(d.sum()) / n,
        "rmse": math.sqrt(dd / n),
        "sqnr_db": 10 * math.log10(aa / dd),
        "max_abs": float(located[at]),
        "max_abs_at": [int(i) for i in numpy.unravel_index(at, tuple(a.shape))],
        "violations": int((located > atol + rtol * x.abs()).sum()),
        "nonfinite": int(bad.sum()),
    }


def clear_noise(n: int, g: torch.Generator, tol: float) -> torch.Tensor:
    """Differences either well inside (tol/100) or well outside (tol·10) the tolerance, so a
    float32 and a float64 count of violations must agree exactly."""
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    outside = torch.rand(n, generator=g) < 0.01
    return sign * torch.where(outside, tol * 10, tol / 100)


def assert_matches(diff: object, ref: dict) -> None:
    got = diff.model_dump()  # type: ignore[attr-defined]
    for key in ("max_abs", "max_abs_at", "violations", "nonfinite"):
        assert got[key] == ref[key], key
    for key in ("rel_diff", "mean_abs", "rmse", "sqnr_db"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5), key


def test_fused_pass_matches_float64_reference_on_random_data_across_chunks_and_threads() -> None:
    g = torch.Generator().manual_seed(3)
    n = (1 << 21) + 17  # 65 chunks, a ragged last one; enough for 2 threads
    a = torch.randn(n, generator=g)
    b = a + clear_noise(n, g, 1.2e-5).float()
    rtol, atol = 1.3e-6, 1e-5
    ref = reference_diff(a, b, rtol, atol)
    assert ref["violations"] > 1000
    one = tensor_diff(a, b, threads=1)
    two = tensor_diff(a, b, threads=2)
    assert one.model_dump() == two.model_dump()  # chunk order fixed: threads change nothing
    assert_matches(two, ref)
    assert two.baseline_at_max == float(a[ref["max_abs_at"][0]])
    small = tensor_diff(a[:5000].reshape(50, 100), b[:5000].reshape(50, 100), chunk=333)
    assert_matches(small, reference_diff(a[:5000].reshape(50, 100), b[:5000], rtol, atol))


def test_max_location_is_the_first_of_equal_maxima_in_different_chunks() -> None:
    a = torch.zeros(300_000)
    b = a.clone()
    b[[70_000, 250_000]] = 2.0
    b[[250_001]] = -2.0
    for threads in (1, 2):
        d = tensor_diff(a, b, chunk=4096, threads=threads)
        assert d.max_abs == 2.0 and d.max_abs_at == [70_000] and d.violations == 3


def test_non_finite_values_spread_over_chunks() -> None:
    g = torch.Generator().manual_seed(4)
    n = 1 << 21
    a = torch.randn(n, generator=g)
    b = a + clear_noise(n, g, 1.2e-5).float()
    a[40_000] = b[40_000] = float("-inf")  # equal: not counted, not a difference
    b[100_000] = float("nan")
    a[1_500_000] = float("inf")
    b[1_900_000] = float("-inf")
    ref = reference_diff(a, b, 1.3e-6, 1e-5)
    assert ref["nonfinite"] == 3 and ref["max_abs_at"] == [100_000]
    for threads in (1, 2):
        assert_matches(tensor_diff(a, b, threads=threads), ref)
    # float32 overflow of b - a (finite inputs): redone in float64, not counted as non-finite
    a2, b2 = torch.zeros(100_000), torch.zeros(100_000)
    a2[77_777], b2[77_777] = -3e38, 3e38
    over = tensor_diff(a2, b2)
    assert over.nonfinite == 0 and over.max_abs == pytest.approx(6e38) and over.violations == 1
    assert over.max_abs_at == [77_777] and math.isfinite(over.rmse)


def test_denormal_inputs() -> None:
    g = torch.Generator().manual_seed(5)
    n = 50_000
    a = torch.randn(n, generator=g) * 1e-40  # float32 denormals (< 1.2e-38)
    steps = torch.randint(-3, 4, (n,), generator=g).float()
    b = a + steps * 1.4e-45  # a few of the smallest denormal steps
    assert float(a.abs().max()) < 1.2e-38 and bool((a != b).any())
    ref = reference_diff(a, b, 0.0, 0.0)
    exact = tensor_diff(a, b, rtol=0.0, atol=0.0, chunk=1000)
    assert exact.violations == ref["violations"] == int((a != b).sum())
    assert_matches(exact, ref)
    assert tensor_diff(a, b).violations == 0  # within the default atol


def test_16_bit_and_float64_inputs_match_the_reference() -> None:
    g = torch.Generator().manual_seed(6)
    n = 1 << 20
    a = torch.randn(n, generator=g)
    b = (a + 1e-2 * torch.randn(n, generator=g)).bfloat16()
    rtol, atol = 1.6e-2, 1e-5
    d = tensor_diff(a, b, threads=2)
    ref = reference_diff(a, b, rtol, atol)
    assert d.rtol == rtol and d.dtypes == ["float32", "bfloat16"]
    for key in ("max_abs", "max_abs_at", "nonfinite"):
        assert d.model_dump()[key] == ref[key]
    assert d.violations == pytest.approx(ref["violations"], abs=2)  # float32 vs float64 boundary
    assert d.rel_diff == pytest.approx(ref["rel_diff"], rel=1e-5)
    a64, b64 = a.double(), a.double() + clear_noise(n, g, 2e-7)
    assert_matches(tensor_diff(a64, b64), reference_diff(a64, b64, 1e-7, 1e-7))


def test_worker_error_surfaces_and_leaves_no_threads_or_settings_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from infra_agent.feedback.accuracy import chunk as chunk_module

    a = torch.randn(1 << 21, generator=torch.Generator().manual_seed(8))
    before_threads, before_omp = threading.active_count(), torch.get_num_threads()
    tensor_diff(a, a + 1, threads=2)
    assert torch.get_num_threads() == before_omp
    real = chunk_module.diff_chunk

    def failing(s, a_in, b_in, rtol, atol):  # type: ignore[no-untyped-def]
        if a_in.data_ptr() == a.data_ptr() + 5 * chunk_module.CHUNK * 4:
            raise RuntimeError("chunk 5 broke")
        return real(s, a_in, b_in, rtol, atol)

    monkeypatch.setattr(chunk_module, "diff_chunk", failing)
    with pytest.raises(RuntimeError, match="chunk 5 broke"):
        tensor_diff(a, a + 1, threads=2)
    assert threading.active_count() == before_threads
    assert torch.get_num_threads() == before_omp


def steps(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x moved k[i] representable values away from zero, element by element (k <= 7)."""
    out = x.clone()
    away = torch.where(x < 0, -math.inf, math.inf).to(x.dtype)
    for j in range(int(k.max())):
        out = torch.where(k > j, torch.nextafter(out, away), out)
    return out


def test_max_ulp_counts_representable_steps_in_the_less_precise_dtype() -> None:
    g = torch.Generator().manual_seed(9)
    n = (1 << 21) + 5
    sign = torch.randint(0, 2, (n,), generator=g) * 2 - 1
    a = sign * (1 + torch.rand(n, generator=g) / 2)  # within [1, 1.5): no binade crossed
    k = torch.randint(0, 6, (n,), generator=g)
    k[1_234_567] = 7
    b = steps(a, k)
    assert tensor_diff(a, b, threads=2).max_ulp == 7.0
    assert tensor_diff(a, a.clone()).max_ulp == 0.0
    tiny = torch.full((1000,), 1e-42)  # float32 denormals: spacing 2^-149
    assert tensor_diff(tiny, steps(tiny, torch.full((1000,), 3))).max_ulp == 3.0
    a16 = a[:4096].bfloat16()
    b16 = steps(a16, k[:4096])
    assert tensor_diff(a16, b16).max_ulp == float(k[:4096].max())
    assert tensor_diff(a16.float(), b16).max_ulp == float(k[:4096].max())  # bf16 units
    h = torch.full((100,), 1e-6).half()  # float16 denormal
    assert tensor_diff(h, steps(h, torch.full((100,), 2))).max_ulp == 2.0
    a64 = a[:1000].double()
    assert tensor_diff(a64, steps(a64, k[:1000])).max_ulp == float(k[:1000].max())
    zero = torch.zeros(10)  # a zero baseline counts in units of the smallest denormal
    assert tensor_diff(zero, zero + 1e-3).max_ulp == pytest.approx(1e-3 * 2.0**149, rel=1e-6)
    nan = b.clone()
    nan[99] = float("nan")
    assert tensor_diff(a, nan).max_ulp == math.inf
    assert tensor_diff(torch.arange(10), torch.arange(10) + 1).max_ulp is None
    x = torch.randn(4, 8, generator=g)
    text = compare_paths({"x": x}, {"x": steps(x, torch.full((4, 8), 2))}).render()
    assert "; max ULP 2\n" in text
