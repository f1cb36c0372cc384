"""Harness for tiered-cache-load-order: seeded requests served with layer-wise loading from the
host tier; every output is checked here against its own prompt's KV, and the load/compute
overlap is computed here from the run's spans."""

from __future__ import annotations

from typing import Any

import torch

from infra_agent.feedback.timeline import intervals
from infra_agent.tasks.harness import Arm, CheckResult, RequestLoadHarness

LOAD_KEYS = (
    "layers", "page_elems", "topk", "load_us", "stall_prob", "stall_us", "lead_us", "compute_us",
)  # fmt: skip
MODULUS = 1_000_000_007


def expected_outputs(prompts: list[int], layers: int, page_elems: int, topk: int) -> torch.Tensor:
    """Each request's output from its own layers, computed here: sum over layers of
    (l + 1) * sum of kv[l] at the indexer's positions (the model's definition)."""
    pos = torch.arange(page_elems, dtype=torch.int64)
    slot = torch.arange(topk, dtype=torch.int64)
    out = []
    for p in prompts:
        total = 0
        for layer in range(layers):
            kv = (pos * 7919 + p * 31 + layer * 1_000_003) % MODULUS
            total += (layer + 1) * int(kv[(slot * 37 + p + layer * 11) % page_elems].sum())
        out.append(total)
    return torch.tensor(out, dtype=torch.int64)


def overlap_ratio(spans: list[Any], a: str = "load.", b: str = "compute.") -> float:
    """The mean over spans named `a`* of the share of each inside the union of spans named `b`*:
    how much of a typical layer load is hidden under compute. Each load counts once: a
    time-weighted ratio (time(A ∩ B) / time(A)) is dominated by the few loads the OS preempted
    for milliseconds on a busy machine, and its paired noise was 10x this one's (2.9% vs 0.25%
    per pair at load 2)."""
    span_a = [(int(s), int(e)) for n, s, e in spans if str(n).startswith(a)]
    span_b = [(int(s), int(e)) for n, s, e in spans if str(n).startswith(b)]
    shares = intervals.covered_fractions(span_a, span_b)
    return sum(shares) / len(shares) if shares else 0.0


class TaskHarness(RequestLoadHarness):
    load_keys = LOAD_KEYS

    def load_summary(self) -> str:
        p = self.params
        return (
            f"{p['requests']} requests with their {p['layers']} KV layers loaded layer by layer "
            f"from the host tier while the forward runs (load stalls with probability "
            f"{p['stall_prob']:g})"
        )

    def metric_words(self) -> str:
        return (
            "read_before_ready_per_10k: outputs computed from a layer read before it was loaded "
            "(checked by the harness); overlap_ratio and requests_per_s as constraints"
        )

    def run(self, arm: Arm, n: int, seed: int, **overrides: Any) -> dict[str, Any]:
        served = self.serve_load(arm, n, seed, **overrides)
        load, result, seconds = served.load, served.result, served.seconds
        expected = expected_outputs(
            served.prompts, load["layers"], load["page_elems"], load["topk"]
        )
        wrong = served.outputs != expected
        spans = result.get("spans") or []
        return {
            "requests": n,
            "read_before_ready": int(wrong.sum()),
            "corrupted": wrong.nonzero().flatten().tolist()[:20],
            "overlap_ratio": overlap_ratio(spans) if isinstance(spans, list) else 0.0,
            "spans": spans,
            "seconds": seconds,
        }

    def check(self, arm: Arm, seed: int) -> CheckResult:
        """Functional check with the load finished before each forward (no overlap, no race).
        Then the invariant, with the race forced: loads four times slower than compute, so the
        forward catches up with the loader at every layer, and every output must still be right
        (a reader that skips the per-layer wait reads a layer not yet loaded)."""
        n = self.params["check_requests"]
        found = self.run(arm, n, seed, overlap=False)
        ok = found["read_before_ready"] == 0
        slow = 4.0 * self.params["compute_us"]
        forced = self.run(arm, n, seed + 1, load_us=slow, stall_prob=0.0)
        k = forced["read_before_ready"]
        return CheckResult(
            passed=ok,
            tolerance="exact: every request's output from its own KV",
            detail=None
            if ok
            else f"{found['read_before_ready']} of {n} outputs wrong without overlap",
            invariants={
                "reads-after-load": None
                if k == 0
                else f"{k} of {n} requests computed with a layer read before it was loaded "
                f"(loads forced {slow:g} us per layer against {self.params['compute_us']:g} us "
                f"of compute; first: {forced['corrupted'][:5]})"
            },
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        n = self.params["requests"]
        found = self.run(arm, n, seed)
        k = found["read_before_ready"]
        return {
            "read_before_ready_per_10k": 1e4 * k / n,
            "read_before_ready": float(k),
            "requests": float(n),
            "overlap_ratio": max(found["overlap_ratio"], 1e-6),
            "requests_per_s": n / found["seconds"],
        }

    def health(self, arm: Arm, seed: int) -> dict[str, float | int | str | bool]:
        n = self.params["health_requests"]
        found = self.run(arm, n, seed)
        return {
            "requests": n,
            "read_before_ready": found["read_before_ready"],
            "read_before_ready_per_10k": 1e4 * found["read_before_ready"] / n,
            "overlap_ratio": round(found["overlap_ratio"], 4),
        }

    def health_problems(
        self,
        baseline: dict[str, float | int | str | bool],
        candidate: dict[str, float | int | str | bool],
    ) -> list[str]:
        k = int(candidate.get("read_before_ready", 0))
        if k == 0:
            return []
        return [
            f"{k} of {candidate['requests']} requests read a layer before it was loaded "
            f"(baseline {baseline.get('read_before_ready')}); the task requires zero"
        ]

    def diagnose(self, arm: Arm) -> Any:
        """The read-before-ready rate with overlap, the same load without overlap, and the
        load/compute overlap from the timeline instrument."""
        from pathlib import Path

        from infra_agent.feedback.pyprofile import profile_while, python_descendant
        from infra_agent.feedback.timeline import TraceEvent, summarize
        from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Diagnosis, Localization

        n = self.params["health_requests"]
        pid = python_descendant(arm.worker.process.pid)  # type: ignore[attr-defined]
        profile, load = profile_while(pid, lambda: self.run(arm, n, DIAGNOSE_SEED), rate=200)
        assert isinstance(load, dict)
        serial = self.run(arm, n, DIAGNOSE_SEED, overlap=False)
        threads = _threads(profile, [Path(arm.sandbox.root)])
        events = [
            TraceEvent(
                name=str(name),
                category="span",
                start_us=start / 1e3,
                dur_us=(end - start) / 1e3,
                track="load" if str(name).startswith("load.") else "forward",
            )  # fmt: skip
            for name, start, end in load["spans"]
        ]
        timeline = summarize(events, classes={}, overlaps=[(r"^load\.", r"^compute\.")])
        overlap = timeline.overlaps[0]
        hidden = overlap_ratio(load["spans"])  # the constraint's definition
        rate = 1e4 * load["read_before_ready"] / n
        return Diagnosis(
            reproduced=load["read_before_ready"] > 0,
            symptom=f"{load['read_before_ready']} of {n} requests ({rate:.1f} per 10k) computed "
            "with a layer's indexer buffer before that layer was loaded",
            measured={
                "read_before_ready_per_10k": rate,
                "read_before_ready_without_overlap": float(serial["read_before_ready"]),
                "overlap_ratio": hidden,
            },
            localization=Localization(
                stage="the order of the layer loads and the forward's reads"
                if load["read_before_ready"] and not serial["read_before_ready"]
                else None,
                thread=" and ".join(threads) or None,
                detail=f"with the load finished before each forward the same requests give "
                f"{serial['read_before_ready']} wrong outputs (with overlap "
                f"{load['read_before_ready']}): the threads that run during the forward are "
                + (", ".join(f"{t} ({fn})" for t, fn in threads.items()) or "unknown"),
            ),
            evidence=[
                f"overlap: a layer load's share hidden under compute {hidden:.3f} on average "
                f"(the constraint's overlap_ratio); time-weighted {overlap.ratio or 0.0:.3f}, "
                f"exposed load {overlap.exposed_a_us / 1e3:.1f} ms of {overlap.time_a_us / 1e3:.1f} ms",
                f"with overlap: {load['read_before_ready']} wrong; without: {serial['read_before_ready']} wrong",
                f"first wrong requests: {load['corrupted'][:8]}",
            ],
            instruments=["harness stress run (every output checked)", "timeline.summarize overlap"],
        )


def _threads(profile: Any, within: list[Any]) -> dict[str, str]:
    """Thread name -> its busiest workspace function, from a py-spy profile's stacks."""
    from collections import Counter

    from infra_agent.feedback.pyprofile import FunctionProfile

    assert isinstance(profile, FunctionProfile)
    busiest: dict[str, Counter[str]] = {}
    for stack, count in profile.stacks.items():
        head, *frames = stack.split(";")
        name = head.split(": ", 1)[1] if ": " in head else head
        one = FunctionProfile(pid=profile.pid, duration_s=0, samples=count, stacks={stack: count})
        rows = one.functions(within, limit=1)
        if rows:
            busiest.setdefault(name, Counter())[rows[0].where.rsplit("/", 1)[-1]] += count
    return {name: c.most_common(1)[0][0] for name, c in busiest.items()}
