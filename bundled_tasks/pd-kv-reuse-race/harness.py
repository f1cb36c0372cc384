"""Harness for pd-kv-reuse-race: a seeded load of requests through the PD pair; every request's
output is checked here against the KV its own prompt must produce (never a count the candidate
reports about itself)."""

from __future__ import annotations

from typing import Any

import torch

from infra_agent.tasks.harness import Arm, CheckResult, RequestLoadHarness, poisson_upper

FORCED_SEED_SALT = 0x5717
"""Separates the forced-stall run's requests from the functional check's."""

LOAD_KEYS = (
    "concurrency", "pages", "slot_elems", "writers", "write_us", "stall_prob", "stall_min_ms",
    "stall_max_ms", "timeout_ms", "decode_steps", "step_us",
)  # fmt: skip
"""Task params passed through to `serve.run_load`."""


def expected_outputs(prompts: list[int], pages: int, slot_elems: int) -> torch.Tensor:
    """What each request must output: sum_j (j+1) * kv[p, j] over its KV pages, where the model's
    KV is kv[p, j] = (p * slot_elems + j) * 1_000_003 + prompt (computed here independently)."""
    idx = torch.arange(pages * slot_elems, dtype=torch.int64).reshape(pages, slot_elems)
    weights = torch.arange(1, slot_elems + 1, dtype=torch.int64)
    base = int((idx * 1_000_003 * weights).sum())
    per_prompt = pages * int(weights.sum())
    return torch.tensor([base + per_prompt * p for p in prompts], dtype=torch.int64)


class TaskHarness(RequestLoadHarness):
    load_keys = LOAD_KEYS

    def load_summary(self) -> str:
        p = self.params
        return (
            f"{p['requests']} requests through the prefill/decode pair, {p['concurrency']} in "
            f"flight; a stall with probability {p['stall_prob']:g} delays a decode past its "
            f"{p['timeout_ms']} ms timeout"
        )

    def metric_words(self) -> str:
        return (
            "corruptions_per_10k: outputs not matching their own prompt's KV (checked by the "
            "harness); requests_per_s from the harness clock"
        )

    def run(self, arm: Arm, n: int, seed: int, **overrides: Any) -> dict[str, Any]:
        """Serve `n` seeded requests; returns counts verified here and the harness-clock time."""
        served = self.serve_load(arm, n, seed, **overrides)
        load = served.load
        wrong = served.outputs != expected_outputs(
            served.prompts, load["pages"], load["slot_elems"]
        )
        return {
            "requests": n,
            "corruptions": int(wrong.sum()),
            "corrupted": wrong.nonzero().flatten().tolist()[:20],
            "aborts": int(served.result.get("aborts", -1)),
            "seconds": served.seconds,
        }

    def check(self, arm: Arm, seed: int) -> CheckResult:
        """Functional check without stalls and with a generous timeout (no aborts, so no reuse
        race even on a starved machine): every output right. Then the invariant, with the race
        forced: many transfers stall past the timeout and are aborted, and decoding takes long
        enough that a late write lands in the next owner's slots while it decodes; every request
        must still decode from its own KV."""
        n = self.params["check_requests"]
        found = self.run(arm, n, seed, stall_prob=0.0, timeout_ms=60_000.0)
        ok = found["corruptions"] == 0
        p = self.params
        forced = self.run(
            arm, p["forced_requests"], seed ^ FORCED_SEED_SALT,
            stall_prob=p["forced_stall_prob"], decode_steps=p["forced_decode_steps"],
        )  # fmt: skip
        k, m = forced["corruptions"], forced["requests"]
        return CheckResult(
            passed=ok,
            tolerance="exact: every request's output is its own KV's checksum",
            detail=None if ok else f"{found['corruptions']} of {n} outputs wrong without any load",
            invariants={
                "reads-own-kv": None
                if k == 0
                else f"{k} of {m} requests decoded another request's KV with transfer stalls "
                f"forced ({forced['aborts']} aborts; first: {forced['corrupted'][:5]})"
            },
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        n = self.params["requests"]
        found = self.run(arm, n, seed)
        k = found["corruptions"]
        return {
            "corruptions_per_10k": 1e4 * k / n,
            "corruptions": float(k),
            "requests": float(n),
            "requests_per_s": n / found["seconds"],
        }

    def health(self, arm: Arm, seed: int) -> dict[str, float | int | str | bool]:
        n = self.params["health_requests"]
        found = self.run(arm, n, seed)
        return {
            "requests": n,
            "corruptions": found["corruptions"],
            "corruptions_per_10k": 1e4 * found["corruptions"] / n,
            "aborts": found["aborts"],
        }

    def health_problems(
        self,
        baseline: dict[str, float | int | str | bool],
        candidate: dict[str, float | int | str | bool],
    ) -> list[str]:
        k = int(candidate.get("corruptions", 0))
        if k == 0:
            return []
        return [
            f"{k} of {candidate['requests']} requests decoded another request's KV under load "
            f"(baseline {baseline.get('corruptions')}); the task requires zero"
        ]

    def diagnose(self, arm: Arm) -> Any:
        """The corruption rate under load; the same seeded load with a timeout no stall reaches
        (no aborts); and a profile of the worker in both runs: the function that runs only when
        corruption happens is where to look."""
        from pathlib import Path

        from infra_agent.feedback.pyprofile import (
            function_only_in,
            profile_while,
            python_descendant,
        )
        from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Diagnosis, Localization

        n = self.params["health_requests"]
        quiet_ms = self.params["stall_max_ms"] * 5
        pid = python_descendant(arm.worker.process.pid)  # type: ignore[attr-defined]
        loaded, load = profile_while(pid, lambda: self.run(arm, n, DIAGNOSE_SEED), rate=200)
        quiet, no_abort = profile_while(
            pid, lambda: self.run(arm, n, DIAGNOSE_SEED, timeout_ms=quiet_ms), rate=200
        )
        assert isinstance(load, dict) and isinstance(no_abort, dict)
        rate = 1e4 * load["corruptions"] / n
        within = [Path(arm.sandbox.root)]
        # Only a function that runs (almost) only with aborts names the path; one that merely
        # runs more often (retried work) does not, nor one in a handful of samples (a suite run
        # at load 4-7 named PrefillNode.__init__, which runs once in each run).
        found = function_only_in(quiet, loaded, within, low_units=n, high_units=n)
        needs_abort = load["corruptions"] > 0 and no_abort["corruptions"] == 0
        localization = Localization(
            stage="a path that runs only when requests time out" if needs_abort else None,
            function=found[0].rsplit("/", 1)[-1] if found and needs_abort else None,
            detail=f"corruption needs aborts: the same load with a {quiet_ms:g} ms timeout gives "
            f"{no_abort['corruptions']} corruptions"
            + (
                f"; this function has {found[2]:.3f} samples per request with aborts and "
                f"{found[1]:.3f} without"
                if found
                else "; no function the profile sees runs only with aborts (the abort path is "
                "too short to sample)"
            )
            if needs_abort
            else "",
        )
        return Diagnosis(
            reproduced=load["corruptions"] > 0,
            symptom=f"{load['corruptions']} of {n} requests ({rate:.1f} per 10k) decoded another "
            f"request's KV under load; {load['aborts']} transfers timed out and were aborted",
            measured={
                "corruptions_per_10k": rate,
                "corruption_ucb_per_10k": 1e4 * poisson_upper(load["corruptions"]) / n,
                "aborts": float(load["aborts"]),
                "corruptions_without_aborts": float(no_abort["corruptions"]),
            },
            localization=localization,
            evidence=[
                f"same seeded load, timeout {self.params['timeout_ms']:g} ms: "
                f"{load['corruptions']} corrupted, {load['aborts']} aborts",
                f"same load, timeout {quiet_ms:g} ms: "
                f"{no_abort['corruptions']} corrupted, {no_abort['aborts']} aborts",
                f"first corrupted requests: {load['corrupted'][:8]}",
                "profile with aborts: " + loaded.render(within, 4).replace("\n", "; "),
            ],
            instruments=[
                "harness stress run (every output checked)",
                "differential run",
                "pyprofile worker (with vs without aborts)",
            ],
        )
