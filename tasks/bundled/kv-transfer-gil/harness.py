"""Harness for kv-transfer-gil: engine steps timed by the harness's clock with and without the
KV transfer; the transferred pages are checked against what was sent."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel

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

    def diagnose(self, arm: Arm) -> Any:
        """Transfer overhead from samples, then thread samples of the worker during a long run."""
        import threading

        from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Diagnosis, Localization

        samples = [self.sample(arm, DIAGNOSE_SEED + i) for i in range(5)]
        overhead = overhead_pct(samples)
        long_kv = make_kv({**self.params, "steps": self.params["steps"] * 10}, DIAGNOSE_SEED)
        errors: list[BaseException] = []

        def long_run() -> None:
            try:
                arm.worker.call("engine:run_steps", long_kv, timeout_s=120, **self._kwargs())
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        runner = threading.Thread(target=long_run, name="diagnose-long-run")
        runner.start()
        try:
            pid = python_descendant(arm.worker.process.pid)  # type: ignore[attr-defined]
            evidence = gil_evidence(sample_threads(pid, 25, 0.003), "py-spy dump --json")
        finally:
            runner.join()
        if errors:
            raise errors[0]
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
                thread=evidence.holder_thread,
                function=evidence.holder_function,
                detail=f"holds the GIL in {evidence.holder_share:.0%} of samples while thread "
                f"'{evidence.starved_thread}' waits for it ({evidence.starved_share:.0%} of samples, at "
                f"{evidence.starved_function})",
            ),
            blocking_stack=evidence.holder_stack,
            evidence=[
                f"{evidence.samples} thread samples ({evidence.source}) during a {long_kv.shape[0]}-step run",
                f"GIL holder: {evidence.holder_thread} in {evidence.holder_function} "
                f"({evidence.holder_share:.0%} of samples)",
                f"starved: {evidence.starved_thread} without the GIL at {evidence.starved_function} "
                f"({evidence.starved_share:.0%} of samples)",
                *(
                    f"sample {i}: {s['step_time_ms']:.2f} ms with transfer, {s['dispatch_only_ms']:.2f} ms without"
                    for i, s in enumerate(samples)
                ),
            ],
            instruments=["harness.sample", "gil (py-spy thread dumps)"],
        )


class GilEvidence(BaseModel):
    """Who held the GIL while the steps ran, from thread samples."""

    samples: int
    holder_thread: str | None
    holder_function: str | None
    holder_share: float
    """Share of samples in which the holder held the GIL in that function."""
    holder_stack: list[str]
    starved_thread: str | None
    starved_share: float
    """Share of samples in which the starved thread waited while the holder held the GIL."""
    starved_function: str | None
    source: str


def gil_evidence(dumps: list[list[dict[str, Any]]], source: str) -> GilEvidence:
    """Aggregate thread dumps: the (thread, innermost workspace frame) holding the GIL most often,
    and the thread most often waiting (not holding it) while it did."""
    held: Counter[tuple[str, str]] = Counter()
    stacks: dict[tuple[str, str], list[str]] = {}
    waiting: Counter[str] = Counter()
    waiting_at: dict[str, Counter[str]] = {}
    for dump in dumps:
        holder = next((t for t in dump if t.get("owns_gil")), None)
        if holder is None:
            continue
        frames = holder.get("frames", [])
        key = (str(holder.get("thread_name")), _frame(frames[0]) if frames else "?")
        held[key] += 1
        stacks.setdefault(key, [_frame(f) for f in frames])
        for t in dump:
            if t is holder or t.get("thread_name") == holder.get("thread_name"):
                continue
            name = str(t.get("thread_name"))
            waiting[name] += 1
            inner = [f for f in t.get("frames", []) if "threading.py" not in f.get("filename", "")]
            where = (
                _frame(next((f for f in inner if "queue.py" not in f["filename"]), inner[0]))
                if inner
                else "?"
            )
            waiting_at.setdefault(name, Counter())[where] += 1
    n = max(1, len(dumps))
    (holder_thread, holder_function), count = held.most_common(1)[0] if held else ((None, None), 0)
    starved, starved_count = waiting.most_common(1)[0] if waiting else (None, 0)
    return GilEvidence(
        samples=len(dumps),
        holder_thread=holder_thread,
        holder_function=holder_function,
        holder_share=count / n,
        holder_stack=stacks.get((holder_thread, holder_function), []) if holder_thread else [],
        starved_thread=starved,
        starved_share=starved_count / n,
        starved_function=waiting_at[starved].most_common(1)[0][0] if starved else None,
        source=source,
    )


def _frame(frame: dict[str, Any]) -> str:
    return f"{Path(str(frame.get('filename', '?'))).name}:{frame.get('name', '?')}"


def overhead_pct(samples: list[dict[str, float]]) -> float:
    """Transfer overhead on step time over several samples, in percent: 1 - best step time without
    transfer / best step time with it (the minimum, because noise on a shared machine only adds)."""
    with_t = min(s["step_time_ms"] for s in samples)
    without = min(s["dispatch_only_ms"] for s in samples)
    return 100.0 * (1.0 - without / with_t)


def python_descendant(pid: int) -> int:
    """The first process at or below `pid` running Python (the sandbox may wrap the worker)."""
    from pathlib import Path

    todo = [pid]
    while todo:
        current = todo.pop(0)
        try:
            cmdline = Path(f"/proc/{current}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if b"python" in Path(cmdline.decode(errors="replace")).name.encode():
            return current
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return pid


def sample_threads(pid: int, samples: int, interval_s: float) -> list[list[dict[str, Any]]]:
    """`samples` py-spy dumps of `pid` (threads with their Python frames and GIL ownership)."""
    import json
    import shutil
    import subprocess
    import sys
    import time
    from pathlib import Path

    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    dumps = []
    for _ in range(samples):
        done = subprocess.run(
            [exe, "dump", "--pid", str(pid), "--json", "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode == 0 and done.stdout.strip():
            dumps.append(json.loads(done.stdout))
        time.sleep(interval_s)
    return dumps
