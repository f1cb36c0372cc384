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
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

# A helper for harness authors (the exact bound of a rare event count), from the judgement core.
from infra_agent.judgement.intervals import poisson_upper as poisson_upper
from infra_agent.tasks.manifest import TaskManifest
from infra_agent.tasks.workload import DEFAULT_SEEDS, InputSpec, Workload

if TYPE_CHECKING:
    from infra_agent.sandboxes.base import Sandbox


class IncorrectOutput(Exception):
    """Raised by a harness when a candidate's output is wrong (also during timed samples)."""


class BaselineFailure(Exception):
    """The baseline failed while the harness was working for the candidate (e.g. a serving
    harness scoring the candidate's outputs on the baseline server): the patch is not to blame."""


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


class RequestLoadHarness(Harness):
    """A seeded load of requests served by the workspace's `serve.run_load(prompts, seed, ...)`,
    whose outputs (one int64 per request) the harness checks itself. A subclass names the task
    params passed through (`load_keys`) and describes its load and metric in words."""

    load_keys: tuple[str, ...] = ()
    """Task params passed through to `serve.run_load`."""

    @abc.abstractmethod
    def load_summary(self) -> str:
        """The load in one line, for the workload's summary."""

    @abc.abstractmethod
    def metric_words(self) -> str:
        """What the metric counts and how the harness checks it, for the workload."""

    def workload(self, knobs: dict[str, Any]) -> Workload:
        p, n = self.params, self.params["requests"]
        load = ", ".join(f"{key}={p[key]!r}" for key in self.load_keys)
        return Workload(
            summary=self.load_summary(),
            inputs=[InputSpec(name="prompts", shape=[n], dtype="int", what="40-bit request ids")],
            params=dict(p),
            knobs=dict(knobs),
            seeds="fresh request ids and stalls from an unseen seed for every check and sample; "
            "the setup uses seed 0",
            metric=self.metric_words(),
            setup="import random\nimport serve\nrng = random.Random(0)\n"
            f"prompts = [rng.randrange(1 << 40) for _ in range({n})]\n",
            call=f"serve.run_load(prompts, seed=0, {load})",
        )

    def serve_load(self, arm: Arm, n: int, seed: int, **overrides: Any) -> LoadRun:
        """Serve `n` requests drawn from `seed` (params overridden by `overrides`), timed with
        the harness's clock; IncorrectOutput unless there is one output per request."""
        import torch

        load = {key: self.params[key] for key in self.load_keys} | overrides
        prompts = seeded_prompts(n, seed)
        result, seconds = arm.worker.timed_call(
            "serve:run_load", prompts, seed=seed, timeout_s=self.manifest.budget.call_timeout_s,
            **load,
        )  # fmt: skip
        outputs = result.get("outputs") if isinstance(result, dict) else None
        if not isinstance(outputs, torch.Tensor) or outputs.shape != (n,):
            raise IncorrectOutput(
                f"expected {n} request outputs, got {getattr(outputs, 'shape', outputs)!r}"
            )
        return LoadRun(result, outputs, load, prompts, seconds)


@dataclass
class LoadRun:
    """One served load: what `run_load` returned, its outputs, the load it ran with, the
    requests it served and the harness-clock seconds."""

    result: dict[str, Any]
    outputs: Any
    load: dict[str, Any]
    prompts: list[int]
    seconds: float


# Helpers for harness authors.


def seeded_prompts(n: int, seed: int) -> list[int]:
    """`n` request ids (40-bit integers) drawn from `seed`: a load the candidate cannot predict."""
    rng = random.Random(seed)
    return [rng.randrange(1 << 40) for _ in range(n)]
