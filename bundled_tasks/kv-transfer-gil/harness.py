"""Harness for kv-transfer-gil: engine steps timed by the harness's clock with and without the
KV transfer; the transferred pages are checked against what was sent."""

from __future__ import annotations

from typing import Any

import torch

from infra_agent.tasks.harness import Arm, CheckResult, Harness, IncorrectOutput
from infra_agent.tasks.workload import InputSpec, Workload


def make_kv(params: dict[str, Any], seed: int) -> torch.Tensor:
    """KV pages to ship: [steps, chunks, chunk_elems] float32."""
    gen = torch.Generator().manual_seed(seed)
    shape = (params["steps"], params["transfer_chunks"], params["chunk_elems"])
    return torch.randn(shape, generator=gen)


class TaskHarness(Harness):
    def workload(self, knobs: dict[str, Any]) -> Workload:
        p = self.params
        shape = [p["steps"], p["transfer_chunks"], p["chunk_elems"]]
        args = ", ".join(f"{k}={v!r}" for k, v in self._kwargs().items())
        return Workload(
            summary=f"{p['steps']} engine steps ({p['moe_layers']} MoE dispatch of "
            f"{p['dispatch_wait_us']} us each) while {p['transfer_chunks']} KV chunks per step "
            f"({p['chunk_wait_us']} us each) are shipped on the transfer thread",
            inputs=[InputSpec(name="kv", shape=shape, dtype="float32", what="KV pages, randn")],
            params=dict(p),
            knobs=dict(knobs),
            seeds="fresh KV pages from an unseen seed for every check and sample; the setup "
            "uses seed 0",
            metric="harness clock around the call, per step: step_time_ms; the same call with "
            "transfer=False gives dispatch_only_ms and transfer_overhead_pct (ABBA order)",
            setup="import torch\nimport scheduler\n"
            f"kv = torch.randn({tuple(shape)!r}, generator=torch.Generator().manual_seed(0))\n",
            call=f"scheduler.run_steps(kv, transfer=True, {args})",
        )

    def _kwargs(self) -> dict[str, Any]:
        p = self.params
        return {
            "moe_layers": p["moe_layers"],
            "dispatch_wait_us": p["dispatch_wait_us"],
            "chunk_wait_us": p["chunk_wait_us"],
        }

    def _timed(self, arm: Arm, kv: torch.Tensor, transfer: bool) -> tuple[Any, float]:
        return arm.worker.timed_call(
            "scheduler:run_steps", kv, transfer=transfer, timeout_s=60, **self._kwargs()
        )

    def _verify(self, result: Any, kv: torch.Tensor) -> str | None:
        received = result.get("received") if isinstance(result, dict) else None
        if not isinstance(received, torch.Tensor) or received.shape != kv.shape:
            return f"expected the received KV {tuple(kv.shape)}, got {getattr(received, 'shape', received)!r}"
        bad = int((received != kv).any(dim=-1).sum())
        return (
            f"{bad} of {kv.shape[0] * kv.shape[1]} KV chunks did not arrive intact" if bad else None
        )

    def _late(self, result: Any, kv: torch.Tensor) -> str | None:
        """The invariant: no step returned before its transfer completed (the scheduler, outside
        the editable code, compares what arrived with the step's pages as the step returns)."""
        late = result.get("late_steps") if isinstance(result, dict) else None
        if not isinstance(late, list):
            return "the scheduler's report is missing"
        if not late:
            return None
        return (
            f"{len(late)} of {kv.shape[0]} steps returned before their KV transfer completed "
            f"(steps {late[:6]}); the scheduler reuses a step's pages once it returns"
        )

    def check(self, arm: Arm, seed: int) -> CheckResult:
        kv = make_kv(self.params, seed)
        result = arm.worker.call("scheduler:run_steps", kv, timeout_s=60, **self._kwargs())
        problem = self._verify(result, kv)
        return CheckResult(
            passed=problem is None,
            max_abs_err=None if problem else 0.0,
            tolerance="exact (every KV chunk received bit for bit)",
            detail=problem,
            invariants={"transfer-before-return": self._late(result, kv)},
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        """Step time with transfer and the dispatch-only step time, measured ABBA (with,
        without, without, with) so slow drift on a shared machine cancels in the overhead."""
        kv = make_kv(self.params, seed)
        with_t, without = [], []
        for transfer in (True, False, False, True):
            result, seconds = self._timed(arm, kv, transfer)
            if transfer:
                problem = self._verify(result, kv) or self._late(result, kv)
                if problem:
                    raise IncorrectOutput(problem)
            (with_t if transfer else without).append(seconds)
        steps = kv.shape[0]
        step, alone = sum(with_t) / 2, sum(without) / 2
        return {
            "step_time_ms": 1e3 * step / steps,
            "dispatch_only_ms": 1e3 * alone / steps,
            "transfer_overhead_pct": 100.0 * (1.0 - alone / step),
        }

    def diagnose(self, arm: Arm) -> Any:
        """Transfer overhead from samples, then the GIL tracer on the worker during a long run."""
        import threading
        import time

        from infra_agent.feedback.gil import PySpyUnavailable, trace_pid
        from infra_agent.feedback.pyprofile import python_descendant
        from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Diagnosis, Localization

        samples = [self.sample(arm, DIAGNOSE_SEED + i) for i in range(5)]
        overhead = overhead_pct(samples)
        # A long run to sample (small pages: the request must reach the worker at once).
        long_params = {**self.params, "steps": self.params["steps"] * 25, "chunk_elems": 64}
        long_kv = make_kv(long_params, DIAGNOSE_SEED)
        errors: list[BaseException] = []

        def long_run() -> None:
            try:
                arm.worker.call("scheduler:run_steps", long_kv, timeout_s=120, **self._kwargs())
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        runner = threading.Thread(target=long_run, name="diagnose-long-run")
        runner.start()
        time.sleep(0.5)  # let the run start before sampling it
        try:
            pid = python_descendant(arm.worker.process.pid)  # type: ignore[attr-defined]
            try:
                report = trace_pid(pid, duration_s=2.0, interval_s=0.05)
            except PySpyUnavailable:  # native unwinding fails across some sandboxes
                report = trace_pid(pid, duration_s=2.0, interval_s=0.05, nonblocking=True)
        finally:
            runner.join()
        if errors:
            raise errors[0]
        culprit = report.culprit()
        step = min(s["step_time_ms"] for s in samples)
        alone = min(s["dispatch_only_ms"] for s in samples)
        return Diagnosis(
            reproduced=overhead > 5.0,
            symptom=f"KV transfer adds {overhead:.0f}% to every step ({step:.2f} ms per step with "
            f"transfer vs {alone:.2f} ms dispatch alone): the transfer thread does not overlap",
            measured={
                "transfer_overhead_pct": overhead,
                "step_time_ms": step,
                "dispatch_only_ms": alone,
            },
            localization=Localization(
                thread=culprit.thread, function=culprit.function, detail=culprit.detail
            ),
            blocking_stack=culprit.stack,
            evidence=[
                *report.render().splitlines()[:6],
                *(
                    f"sample {i}: {s['step_time_ms']:.2f} ms with transfer, "
                    f"{s['dispatch_only_ms']:.2f} ms without"
                    for i, s in enumerate(samples)
                ),
            ],
            instruments=["harness.sample", f"gil.trace_pid ({report.method})"],
        )


def overhead_pct(samples: list[dict[str, float]]) -> float:
    """Transfer overhead on step time over several samples, in percent: 1 - best step time without
    transfer / best step time with it (the minimum, because noise on a shared machine only adds)."""
    with_t = min(s["step_time_ms"] for s in samples)
    without = min(s["dispatch_only_ms"] for s in samples)
    return 100.0 * (1.0 - without / with_t)
