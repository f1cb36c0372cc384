"""Harness of the test task: inputs from seeds, exact float64 reference, harness-side timing."""

from __future__ import annotations

import random
from typing import Any

from infra_agent.tasks.harness import Arm, CheckResult, Harness, IncorrectOutput


def make_inputs(n: int, seed: int) -> tuple[float, list[float], list[float]]:
    rng = random.Random(seed)
    return (
        rng.uniform(-2, 2),
        [rng.uniform(-1, 1) for _ in range(n)],
        [rng.uniform(-1, 1) for _ in range(n)],
    )


def max_error(out: Any, a: float, xs: list[float], ys: list[float]) -> float | None:
    if (
        not isinstance(out, list)
        or len(out) != len(xs)
        or not all(isinstance(v, float) for v in out)
    ):
        return None
    return max(abs(o - (a * x + y)) for o, x, y in zip(out, xs, ys, strict=True))


CALLS_PER_SAMPLE = 3


class TaskHarness(Harness):
    def prepare(self, arm: Arm) -> None:
        for seed in self.warmup_seeds:
            arm.worker.call("kernel:axpy", *make_inputs(self.params["n"], seed))

    def check(self, arm: Arm, seed: int) -> CheckResult:
        a, xs, ys = make_inputs(self.params["n"], seed)
        out = arm.worker.call("kernel:axpy", a, xs, ys)
        err = max_error(out, a, xs, ys)
        if err is None:
            return CheckResult(
                passed=False, detail=f"expected {len(xs)} floats, got {type(out).__name__}"
            )
        atol = self.manifest.tolerance.atol or 0.0
        return CheckResult(
            passed=err <= atol,
            max_abs_err=err,
            err_vs_f64=err,
            tolerance=f"atol={atol:g}",
            detail=None if err <= atol else f"max abs err {err:.3g}",
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        """Fastest of CALLS_PER_SAMPLE timed calls, each on its own fresh inputs (the minimum
        is least disturbed by other processes on a shared machine)."""
        times = []
        for i in range(CALLS_PER_SAMPLE):
            a, xs, ys = make_inputs(self.params["n"], seed * CALLS_PER_SAMPLE + i)
            out, seconds = arm.worker.timed_call("kernel:axpy", a, xs, ys)
            err = max_error(out, a, xs, ys)
            if err is None or err > (self.manifest.tolerance.atol or 0.0):
                raise IncorrectOutput(f"timed output wrong (max abs err {err})")
            times.append(seconds)
        return {"latency_ms": min(times) * 1e3}
