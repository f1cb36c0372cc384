"""Harness for kv-transfer-gil: engine steps timed by the harness's clock with and without the
KV transfer; the transferred pages are checked against what was sent."""

from __future__ import annotations

from typing import Any

import torch
from infra_agent.tasks.harness import Arm, CheckResult, Harness, IncorrectOutput


def make_kv(params: dict[str, Any], seed: int) -> torch.Tensor:
    """KV pages to ship: [steps, chunks, chunk_elems] float32."""
    gen = torch.Generator().manual_seed(seed)
    shape = (params["steps"], params["transfer_chunks"], params["chunk_elems"])
    return torch.randn(shape, generator=gen)


class TaskHarness(Harness):
    def _kwargs(self) -> dict[str, Any]:
        p = self.params
        return {
            "moe_layers": p["moe_layers"],
            "dispatch_wait_us": p["dispatch_wait_us"],
            "chunk_wait_us": p["chunk_wait_us"],
        }

    def _timed(self, arm: Arm, kv: torch.Tensor, transfer: bool) -> tuple[Any, float]:
        return arm.worker.timed_call(
            "engine:run_steps", kv, transfer=transfer, timeout_s=60, **self._kwargs()
        )

    def _verify(self, received: Any, kv: torch.Tensor) -> str | None:
        if not isinstance(received, torch.Tensor) or received.shape != kv.shape:
            return f"expected the received KV {tuple(kv.shape)}, got {getattr(received, 'shape', received)!r}"
        bad = int((received != kv).any(dim=-1).sum())
        return (
            f"{bad} of {kv.shape[0] * kv.shape[1]} KV chunks did not arrive intact" if bad else None
        )

    def check(self, arm: Arm, seed: int) -> CheckResult:
        kv = make_kv(self.params, seed)
        received = arm.worker.call("engine:run_steps", kv, timeout_s=60, **self._kwargs())
        problem = self._verify(received, kv)
        return CheckResult(
            passed=problem is None,
            max_abs_err=None if problem else 0.0,
            tolerance="exact (every KV chunk received bit for bit)",
            detail=problem,
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        """Step time with transfer, and the dispatch-only step time measured right after it."""
        kv = make_kv(self.params, seed)
        received, with_transfer = self._timed(arm, kv, True)
        problem = self._verify(received, kv)
        if problem:
            raise IncorrectOutput(problem)
        _, dispatch_only = self._timed(arm, kv, False)
        steps = kv.shape[0]
        return {
            "step_time_ms": 1e3 * with_transfer / steps,
            "dispatch_only_ms": 1e3 * dispatch_only / steps,
            "transfer_overhead_pct": 100.0 * (1.0 - dispatch_only / with_transfer),
        }


def overhead_pct(samples: list[dict[str, float]]) -> float:
    """Transfer overhead on step time over several samples, in percent: 1 - best step time without
    transfer / best step time with it (the minimum, because noise on a shared machine only adds)."""
    with_t = min(s["step_time_ms"] for s in samples)
    without = min(s["dispatch_only_ms"] for s in samples)
    return 100.0 * (1.0 - without / with_t)
