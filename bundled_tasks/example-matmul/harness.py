"""Harness for example-matmul: inputs from fresh seeds, float32 and float64 references computed
here, every timed output verified, time measured by the harness's clock around the RPC call."""

from __future__ import annotations

from typing import Any

import torch

from infra_agent.experiments.worker import ref
from infra_agent.tasks.harness import Arm, CheckResult, Harness, IncorrectOutput
from infra_agent.tasks.workload import InputSpec, Workload

TARGET = "projection:project"
CALLS_PER_SAMPLE = 3
"""Timed calls per sample, each on its own fresh inputs; the sample is their median (less
scheduling noise, and no input is ever timed twice)."""
TIMED_REL_ERR = 1e-4
"""Relative (Frobenius) error against the float32 reference above which a timed output is wrong."""


def make_inputs(params: dict[str, Any], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] and w [k, n], float32, entries ~ N(0, scale^2)."""
    gen = torch.Generator().manual_seed(seed % (1 << 63))
    scale = float(params["scale"])
    x = torch.randn(params["m"], params["k"], generator=gen) * scale
    w = torch.randn(params["k"], params["n"], generator=gen) * scale
    return x, w


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F, in float64."""
    ref64 = ref.double()
    return float((out.double() - ref64).norm() / ref64.norm().clamp_min(1e-300))


class TaskHarness(Harness):
    def workload(self, knobs: dict[str, Any]) -> Workload:
        p = self.params
        tol = self.manifest.tolerance
        return Workload(
            summary=f"one projection y = x @ w, [{p['m']}, {p['k']}] x [{p['k']}, {p['n']}] "
            f"float32; a sample is the median of {CALLS_PER_SAMPLE} timed calls",
            inputs=[
                InputSpec(name="x", shape=[p["m"], p["k"]], dtype="float32", what="randn * scale"),
                InputSpec(name="w", shape=[p["k"], p["n"]], dtype="float32", what="randn * scale"),
            ],
            params=dict(p),
            knobs=dict(knobs),
            seeds="fresh x and w from an unseen seed for every check and every timed call (no "
            "input is timed twice); the setup uses seed 0",
            metric="harness clock around the call: latency_ms",
            setup="import torch\nimport projection\ngen = torch.Generator().manual_seed(0)\n"
            f"x = torch.randn({p['m']}, {p['k']}, generator=gen) * {float(p['scale'])!r}\n"
            f"w = torch.randn({p['k']}, {p['n']}, generator=gen) * {float(p['scale'])!r}\n",
            call="projection.project(x, w)",
            reference="x.double() @ w.double()",
            f64_error="rel_rms",
            atol=tol.atol if tol.atol is not None else 1e-5,
            rtol=tol.rtol if tol.rtol is not None else 1.3e-6,
        )

    def _run(
        self, arm: Arm, seed: int, *, timed: bool
    ) -> tuple[Any, float, torch.Tensor, torch.Tensor]:
        x, w = make_inputs(self.params, seed)
        arm.worker.put("x", x)  # a fresh object in the worker at each put
        arm.worker.put("w", w)
        if timed:
            out, seconds = arm.worker.timed_call(TARGET, ref("x"), ref("w"))
        else:
            out, seconds = arm.worker.call(TARGET, ref("x"), ref("w")), 0.0
        return out, seconds, x, w

    def _shape_problem(self, out: Any) -> str | None:
        shape = (self.params["m"], self.params["n"])
        if (
            not isinstance(out, torch.Tensor)
            or tuple(out.shape) != shape
            or out.dtype != torch.float32
        ):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            return f"expected a float32 tensor of shape {shape}, got {got}"
        if not bool(torch.isfinite(out).all()):
            return "output contains NaN or infinity"
        return None

    def prepare(self, arm: Arm) -> None:
        for seed in self.warmup_seeds:
            self._run(arm, seed, timed=False)

    def check(self, arm: Arm, seed: int) -> CheckResult:
        out, _, x, w = self._run(arm, seed, timed=False)
        problem = self._shape_problem(out)
        if problem is not None:
            return CheckResult(passed=False, detail=problem)
        tol = self.manifest.tolerance
        atol, rtol = (
            tol.atol if tol.atol is not None else 1e-5,
            tol.rtol if tol.rtol is not None else 1.3e-6,
        )
        ref32 = x @ w
        abs_err = (out - ref32).abs()
        passed = bool((abs_err <= atol + rtol * ref32.abs()).all())
        return CheckResult(
            passed=passed,
            max_abs_err=float(abs_err.max()),
            max_rel_err=float((abs_err / ref32.abs().clamp_min(1e-12)).max()),
            err_vs_f64=relative_error(out, x.double() @ w.double()),
            tolerance=f"atol={atol:g} rtol={rtol:g} (float32), plus error vs float64",
            detail=None
            if passed
            else f"max abs err {float(abs_err.max()):.3g} above atol={atol:g}",
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        times = []
        for i in range(CALLS_PER_SAMPLE):
            out, seconds, x, w = self._run(arm, seed * CALLS_PER_SAMPLE + i, timed=True)
            problem = self._shape_problem(out)
            if problem is None and relative_error(out, x @ w) > TIMED_REL_ERR:
                problem = f"relative error {relative_error(out, x @ w):.3g} above {TIMED_REL_ERR:g}"
            if problem is not None:
                raise IncorrectOutput(f"timed output wrong: {problem}")
            times.append(seconds)
        return {"latency_ms": sorted(times)[len(times) // 2] * 1e3}
