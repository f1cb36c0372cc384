"""Serving metrics of one workload run: throughput, TTFT/TPOT percentiles, goodput under SLOs.

`summarize(result, slo)` -> `RunMetrics` (typed, with `render()`); `RunMetrics.sample()` is the
flat {metric: value} dict a harness returns per repetition. Output tokens are the client's count
(`RequestRecord.output_tokens`: token ids received), never the server's `completion_tokens`. Objectives map to metrics:
`throughput` -> output_throughput (tok/s, higher is better), `latency` -> p50 end-to-end latency
(ms, lower is better), `goodput` -> goodput (requests/s that met the SLOs, higher is better).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from infra_agent.judgement.describe import percentile
from infra_agent.serving.load.generator import WorkloadResult

OBJECTIVE_METRICS: dict[str, tuple[str, str, bool]] = {
    "throughput": ("output_throughput", "tok/s", True),
    "latency": ("e2e_latency_p50_ms", "ms", False),
    "goodput": ("goodput", "req/s", True),
}
"""objective -> (sample key, unit, higher_is_better)."""


class SLO(BaseModel):
    """Per-request service-level objectives for goodput (None: not constrained)."""

    ttft_ms: float | None = 2000.0
    tpot_ms: float | None = 200.0
    e2e_ms: float | None = None


class RunMetrics(BaseModel):
    requests: int
    completed: int
    failed: int
    aborted: int
    """Streams aborted by the online health guard."""
    duration_s: float
    input_tokens: int
    output_tokens: int
    """Output tokens received by the client, over completed requests."""
    output_throughput: float
    """Output tokens per second over the run's wall time."""
    total_throughput: float
    """(Input + output) tokens per second."""
    request_throughput: float
    goodput: float
    """Completed requests per second that met every SLO."""
    ttft_ms: dict[str, float]
    """p50 / p90 / p99 time to first token."""
    tpot_ms: dict[str, float]
    """p50 / p90 / p99 time per output token after the first: (latency - ttft) / (tokens - 1)."""
    itl_ms: dict[str, float]
    e2e_latency_ms: dict[str, float]
    spec_accept_length_mean: float | None = None
    client_cpu_s: float | None = None
    """CPU seconds the load generator used."""
    server_cpu_s: float | None = None
    """CPU seconds the server's processes used during the run."""
    client_loop_lag_ms: dict[str, float] = {}
    """p50/p99 of how late the load generator's event loop woke: its TTFT and inter-token
    timestamps can be late by as much."""

    @property
    def output_tokens_per_cpu_s(self) -> float | None:
        """Output tokens per CPU-second of the server's processes: work per CPU time, which CPU
        contention moves less than tokens per wall-clock second."""
        if not self.server_cpu_s or self.server_cpu_s <= 0:
            return None
        return self.output_tokens / self.server_cpu_s

    def sample(self) -> dict[str, float]:
        out = {
            "output_throughput": self.output_throughput,
            "total_throughput": self.total_throughput,
            "request_throughput": self.request_throughput,
            "goodput": self.goodput,
            "failed": float(self.failed),
        }
        if (per_cpu := self.output_tokens_per_cpu_s) is not None:
            out["output_tokens_per_cpu_s"] = per_cpu
        for name in ("server_cpu_s", "client_cpu_s"):
            if (value := getattr(self, name)) is not None:
                out[name] = value
        for key, value in self.client_loop_lag_ms.items():
            out[f"client_loop_lag_{key}_ms"] = value
        for name, pct in (
            ("ttft", self.ttft_ms),
            ("tpot", self.tpot_ms),
            ("e2e_latency", self.e2e_latency_ms),
        ):
            for key, value in pct.items():
                out[f"{name}_{key}_ms"] = value
        return out

    def render(self) -> str:
        return (
            f"{self.output_throughput:.0f} output tok/s, {self.total_throughput:.0f} total tok/s, "
            f"goodput {self.goodput:.2f} req/s; TTFT p50 {self.ttft_ms['p50']:.0f} ms "
            f"p99 {self.ttft_ms['p99']:.0f} ms; TPOT p50 {self.tpot_ms['p50']:.1f} ms; "
            f"{self.completed}/{self.requests} ok in {self.duration_s:.1f} s"
            + (
                f"; {self.output_tokens_per_cpu_s:.0f} output tok per server CPU-s"
                if self.output_tokens_per_cpu_s is not None
                else ""
            )
            + (f"; {self.failed} failed" if self.failed else "")
            + (f"; {self.aborted} aborted by the health guard" if self.aborted else "")
        )


def _pct(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan")}
    arr = np.asarray(values) * 1000.0
    return {f"p{q}": percentile(arr, q) for q in (50, 90, 99)}


def summarize(result: WorkloadResult, slo: SLO | None = None) -> RunMetrics:
    slo = slo or SLO()
    ok = [r for r in result.records if r.success]
    tpots = [
        (r.latency_s - (r.ttft_s or 0.0)) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1
    ]
    good = 0
    for r in ok:
        tpot = (r.latency_s - (r.ttft_s or 0.0)) / max(r.output_tokens - 1, 1)
        if slo.ttft_ms is not None and (r.ttft_s is None or r.ttft_s * 1e3 > slo.ttft_ms):
            continue
        if slo.tpot_ms is not None and tpot * 1e3 > slo.tpot_ms:
            continue
        if slo.e2e_ms is not None and r.latency_s * 1e3 > slo.e2e_ms:
            continue
        good += 1
    accept = [
        float(r.meta["spec_accept_length"])
        for r in ok
        if r.meta.get("spec_accept_length") is not None
    ]
    dur = max(result.duration_s, 1e-9)
    inp = sum(r.prompt_tokens for r in ok)
    out = sum(r.output_tokens for r in ok)
    return RunMetrics(
        requests=len(result.records),
        completed=len(ok),
        failed=sum(1 for r in result.records if not r.success and r.aborted_rule is None),
        aborted=sum(1 for r in result.records if r.aborted_rule is not None),
        duration_s=result.duration_s,
        input_tokens=inp,
        output_tokens=out,
        output_throughput=out / dur,
        total_throughput=(inp + out) / dur,
        request_throughput=len(ok) / dur,
        goodput=good / dur,
        ttft_ms=_pct([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_ms=_pct(tpots),
        itl_ms=_pct([x for r in ok for x in r.itl_s]),
        e2e_latency_ms=_pct([r.latency_s for r in ok]),
        spec_accept_length_mean=float(np.mean(accept)) if accept else None,
        client_cpu_s=result.client_cpu_s,
        server_cpu_s=result.server_cpu_s,
        client_loop_lag_ms={k: v * 1e3 for k, v in result.client_loop_lag_s.items()},
    )
