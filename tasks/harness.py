"""The harness contract: the trusted half of a task.

A task's `harness.py` defines a subclass of `Harness` (named by `harness_class` in task.toml).
It runs in the experiment's own process, never in the sandbox: it generates inputs from seeds the
candidate never sees, computes the reference (and the float64 reference), calls the candidate's
code through `arm.worker` (an RPC worker inside the sandbox), and measures with its own clock.

The experiment engine (`infra_agent.experiments`) drives it:

    for arm in (baseline, candidate): harness.prepare(arm)
    correctness: harness.check(arm, seed) on fresh seeds, both arms
    performance: harness.sample(arm, seed) interleaved ABBA..., adaptive stopping
    health:      harness.health(arm, seed) both arms, then harness.health_problems(base, cand)
    finally:     harness.finish(arm)

Before any experiment, the tools ask `harness.workload(knobs)` what it measures (shapes, seeds
policy, a ready setup; tasks.workload), so the model's cheap checks run on the same inputs.
"""

from __future__ import annotations

import abc
import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from infra_agent.tasks.manifest import TaskManifest
from infra_agent.tasks.workload import DEFAULT_SEEDS, Workload

if TYPE_CHECKING:
    from infra_agent.sandboxes.base import Sandbox


class IncorrectOutput(Exception):
    """Raised by a harness when a candidate's output is wrong (also during timed samples)."""


class CandidateFailure(Exception):
    """The candidate crashed, hung past its timeout, or hit a resource limit."""

    def __init__(self, message: str, *, kind: str = "crash", log_tail: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        """'crash' | 'timeout' | 'memory' | 'protocol' | 'violation'"""
        self.log_tail = log_tail


class Worker(Protocol):
    """An RPC worker running inside the sandbox with the arm's workspace on its sys.path."""

    def call(self, target: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """Call `module:function` in the sandbox. Arguments and result travel in one safe format
        (tensors, numbers, strings, lists, tuples, dicts with string keys; never pickle). Raises
        CandidateFailure on crash/timeout/limit or on a rule violation seen at run time (extra
        threads or child processes left behind, work between calls, hooks left installed), and
        IncorrectOutput when the call changed its inputs and the task is not `inplace`."""
        ...

    def put(self, name: str, value: Any, *, timeout_s: float | None = None) -> None:
        """Store `value` in the worker under `name`; pass `experiments.worker.ref(name)` as an
        argument to use it (inputs are not re-sent while timing). Each put replaces the value
        with a fresh object: nothing of the old one (its methods, what the candidate attached to
        it) runs outside a call, and an identity-keyed cache never sees the same object twice."""
        ...

    def timed_call(
        self, target: str, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> tuple[Any, float]:
        """Like `call`, also returning the round-trip seconds measured by the harness's clock
        (perf_counter_ns in the harness process: the candidate cannot patch it)."""
        ...


@dataclass
class Arm:
    """One side of an experiment: a sandbox with its own copy of the workspace."""

    name: Literal["baseline", "candidate"]
    sandbox: Sandbox
    knobs: dict[str, Any]
    """Effective knob values for this arm (task defaults overlaid with the patch's assignment)."""
    params: dict[str, Any]
    """Effective scale parameters of the task for this run."""
    worker_factory: Any = field(repr=False, default=None)
    _worker: Worker | None = field(default=None, repr=False)
    state: dict[str, Any] = field(default_factory=dict)
    """Scratch space for the harness (e.g. a server handle)."""

    @property
    def worker(self) -> Worker:
        """The arm's RPC worker, started on first use."""
        if self._worker is None:
            self._worker = self.worker_factory(self)
        assert self._worker is not None
        return self._worker


@dataclass
class CheckResult:
    """Correctness of one arm on one fresh input set."""

    passed: bool
    """Output matches the reference within tolerance."""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    err_vs_f64: float | None = None
    """The arm's error against the float64 reference (the task's error measure)."""
    tolerance: str | None = None
    detail: str | None = None
    """Why it failed, in words."""
    compared: str | None = None
    """What was compared, against what, in words (e.g. 'the decode output against the float32
    reference attention'; a statistical check also its outcome): the verdict names it."""
    invariants: dict[str, str | None] = field(default_factory=dict)
    """Each invariant the task declares, checked on this pass: None if it held, else how it
    was broken (in words)."""


class Harness(abc.ABC):
    """Base class for task harnesses. Subclass it in a task's harness.py."""

    warmup_seeds: list[int] = [1, 2]
    """Seeds for warm-up inputs in `prepare()`. The engine replaces them with fresh random seeds
    before `prepare()`; seeds given to check/sample/health are never among them."""

    def __init__(self, manifest: TaskManifest, params: dict[str, Any]) -> None:
        self.manifest = manifest
        self.params = params

    def prepare(self, arm: Arm) -> None:  # noqa: B027 - optional hook
        """Called once per arm before anything else (start a server, warm up). Default: nothing."""

    @abc.abstractmethod
    def check(self, arm: Arm, seed: int) -> CheckResult:
        """Run the arm on fresh inputs derived from `seed` and compare with the references;
        report every invariant the manifest declares in `CheckResult.invariants`."""

    @abc.abstractmethod
    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        """One measurement: {metric name: value} including the manifest's metric and constraint
        metrics. Must time with the harness's clock and should verify the output it timed
        (raise IncorrectOutput), so cached or unfinished results cannot win."""

    def health(self, arm: Arm, seed: int) -> dict[str, float | int | str | bool]:
        """Task health checks for one arm (e.g. corruption counts). Default: none."""
        return {}

    def health_problems(
        self,
        baseline: dict[str, float | int | str | bool],
        candidate: dict[str, float | int | str | bool],
    ) -> list[str]:
        """Reasons the candidate is less healthy than baseline (each names the rule). Default: []."""
        return []

    def finish(self, arm: Arm) -> None:  # noqa: B027 - optional hook
        """Called once per arm at the end, even after failures. Default: nothing."""

    def workload(self, knobs: dict[str, Any]) -> Workload:
        """What this harness measures with these knob values: inputs (shapes, dtypes), the
        parameters, the seeds policy and, where the task has one, a ready setup and the call
        the experiment times (see tasks.workload). Default: the parameters and the seeds policy,
        no setup; a harness whose code can be called on its own should override it."""
        m = self.manifest
        return Workload(
            summary=f"one {m.metric.name} measurement [{m.metric.unit}] per sample",
            params=dict(self.params),
            knobs=dict(knobs),
            seeds=DEFAULT_SEEDS,
            atol=m.tolerance.atol,
            rtol=m.tolerance.rtol,
        )


# Helpers for harness authors.


def seeded_prompts(n: int, seed: int) -> list[int]:
    """`n` request ids (40-bit integers) drawn from `seed`: a load the candidate cannot predict."""
    rng = random.Random(seed)
    return [rng.randrange(1 << 40) for _ in range(n)]


def poisson_upper(k: int, confidence: float = 0.95) -> float:
    """One-sided upper confidence bound on a Poisson mean after observing `k` events (exact:
    the mean whose P(X <= k) is 1 - confidence, found by bisection)."""
    alpha = 1.0 - confidence

    def cdf(lam: float) -> float:
        term = total = math.exp(-lam)
        for i in range(1, k + 1):
            term *= lam / i
            total += term
        return total

    lo, hi = 0.0, k + 10.0 * math.sqrt(k + 1) + 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > alpha else (lo, mid)
    return hi
