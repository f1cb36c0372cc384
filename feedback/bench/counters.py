"""Optional GPU hardware counters for a benchmark arm, through Nsight Compute (`ncu`).

Only when `ncu` is on PATH and the arm runs in its own process (a command or a
`module:function` worker): `ncu --csv --metrics ...` profiles one run and the per-kernel rows
are aggregated. Otherwise the runner reports a plain "unavailable: <why>" (CI has no GPU).
This path is guarded and has not been exercised on a GPU in this repository's tests.
"""

from __future__ import annotations

import csv
import io
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

METRICS = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2__throughput.avg.pct_of_peak_sustained_elapsed",
)


class KernelCounters(BaseModel):
    kernel: str
    launches: int
    metrics: dict[str, float] = Field(default_factory=dict)
    """Metric name -> value (durations summed in ns, percentages averaged)."""


class HardwareCounters(BaseModel):
    """Per-arm, per-kernel counters from one profiled run of each arm."""

    tool: str = "ncu"
    arms: dict[str, list[KernelCounters]] = Field(default_factory=dict)

    def render(self) -> str:
        parts = []
        for arm, kernels in self.arms.items():
            top = sorted(kernels, key=lambda k: -k.metrics.get("gpu__time_duration.sum", 0.0))[:2]
            desc = ", ".join(
                f"{k.kernel[:40]} {k.metrics.get('gpu__time_duration.sum', 0) / 1e3:.1f} us "
                f"SM {k.metrics.get(METRICS[1], 0):.0f}% DRAM {k.metrics.get(METRICS[2], 0):.0f}%"
                for k in top
            )
            parts.append(f"{arm}: {desc or 'no kernels'}")
        return "counters (ncu): " + "; ".join(parts)


def parse_ncu_csv(text: str) -> list[KernelCounters]:
    """Aggregate `ncu --csv` rows (one per kernel launch and metric) per kernel name."""
    start = text.find('"ID"')
    rows = csv.DictReader(io.StringIO(text[start:] if start >= 0 else text))
    kernels: dict[str, KernelCounters] = {}
    seen: dict[str, set[str]] = {}
    counts: dict[tuple[str, str], int] = {}
    for row in rows:
        name = row.get("Kernel Name") or "?"
        metric = row.get("Metric Name") or ""
        try:
            value = float((row.get("Metric Value") or "").replace(",", ""))
        except ValueError:
            continue
        k = kernels.setdefault(name, KernelCounters(kernel=name, launches=0))
        launch_ids = seen.setdefault(name, set())
        launch_ids.add(row.get("ID") or "")
        k.launches = len(launch_ids)
        key = (name, metric)
        counts[key] = counts.get(key, 0) + 1
        if metric.endswith(".sum"):
            k.metrics[metric] = k.metrics.get(metric, 0.0) + value
        else:  # running mean
            n = counts[key]
            k.metrics[metric] = (
                k.metrics.get(metric, 0.0) + (value - k.metrics.get(metric, 0.0)) / n
            )
    return list(kernels.values())


def _argv_for(arm: Any) -> list[str] | None:
    command = getattr(arm, "command", None)
    if command:
        return ["bash", "-c", command]
    spec = getattr(arm, "spec", None)
    if spec:
        loader = "from infra_agent.feedback.bench.usercode import load_callable"
        code = f"{loader}\nload_callable({spec!r})()"
        return [sys.executable, "-c", code]
    return None


def hardware_counters(
    arms: Sequence[Any], names: Sequence[str] = ("baseline", "candidate"), timeout_s: float = 300
) -> tuple[HardwareCounters | None, str | None]:
    """Profile one run of each arm with ncu; (None, 'unavailable: ...') when that is impossible."""
    ncu = shutil.which("ncu")
    if ncu is None:
        return None, "unavailable: ncu (Nsight Compute) not found on PATH"
    result = HardwareCounters()
    for name, arm in zip(names, arms, strict=True):
        argv = _argv_for(arm)
        if argv is None:
            return None, (
                "unavailable: ncu profiles a separate process; give a command or run the "
                "callable in a worker process"
            )
        cmd = [ncu, "--csv", "--metrics", ",".join(METRICS), *argv]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None, f"unavailable: ncu timed out after {timeout_s:.0f} s"
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            return None, f"unavailable: ncu failed ({shlex.join(cmd[:3])}...): {tail[:200]}"
        result.arms[name] = parse_ncu_csv(proc.stdout)
    return result, None
