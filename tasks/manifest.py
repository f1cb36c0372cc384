"""The task manifest (`task.toml`): what is optimized, how it is measured, what a patch may touch.

A task is a folder a user can write without touching this package:

    my-task/
      task.toml      # this manifest
      README.md      # the story: symptom, origin, what "fixed" means
      workspace/     # the code under optimization (copied into each sandbox), or instead
                     # [workspace] package = "sglang": an installed package is the code (tasks.tree)
      harness.py     # trusted: inputs, reference, checks, measurement (never visible to candidates)
      reference.patch (optional) # a known-good fix, used by tests, never shown to the agent
      wrong_fix.patch (optional) # a plausible fix that does not fix it (`tasks check`)
      inject.patch (optional)    # a fault applied to the package to make the baseline, hidden

An open task (`[open]`) has no planted fault: the unmodified engine, a gain target to reach, and
the best result known so far (its reference.patch is a fix someone found and measured).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra_agent.errors import UserError

MANIFEST_FILENAME = "task.toml"
Objective = Literal["throughput", "latency", "accuracy", "goodput", "correctness"]


class Metric(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    """Key in the harness's sample dict, e.g. 'step_time_ms'."""
    unit: str
    """Unit for people, e.g. 'ms', 'tok/s', 'corruptions/10k'."""
    higher_is_better: bool
    """Direction: True for throughput-like metrics, False for times and error rates."""
    companion: str | None = None
    """Another sample key of the same direction, shown beside this one with its own interval;
    it does not decide (serving: output tokens per server CPU-second, which contention from
    other work on the machine moves less than wall-clock throughput)."""
    events: str | None = None
    """A rate metric (rare events, e.g. corrupted requests): the sample key counting events.
    Verdicts then pool the counts of all samples (judgement.rates) instead of comparing
    per-sample medians, and sampling stops once the difference is shown."""
    trials: str | None = None
    """For a rate metric: the sample key counting the trials (requests) the events are out of."""
    per: float = 10_000.0
    """For a rate metric: rates are events per this many trials."""
    target: float | None = None
    """For a rate metric: the rate (per `per` trials) a fix must be shown below, 95% upper
    bound, to count as IMPROVED (the public case: under 3 per 10k)."""

    @model_validator(mode="after")
    def _rate(self) -> Metric:
        if (self.events is None) != (self.trials is None):
            raise ValueError("a rate metric names both 'events' and 'trials'")
        if self.events is not None and self.higher_is_better:
            raise ValueError("a rate metric counts bad events: higher_is_better must be false")
        if self.events is not None and self.companion is not None:
            raise ValueError("a rate metric is judged on pooled counts: it takes no companion")
        return self


class Constraint(BaseModel):
    """A secondary metric the candidate must not worsen beyond a ratio of baseline's median."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    """Key in the harness's sample dict."""
    max_ratio: float
    """Candidate median / baseline median may not exceed this (for a higher-is-better metric,
    baseline / candidate may not exceed it). E.g. 1.3 for 'at most 1.3x baseline time'."""
    higher_is_better: bool = False


class Target(BaseModel):
    """A number the story calls fixed (e.g. 'transfer overhead below 5%'), stated in the first
    message and checked beside every verdict; it does not decide the verdict. Exactly one of
    `below`, `above` (the candidate's median of a sample key) or `gain` (the improvement factor
    on the task's metric, its 95% interval's low end)."""

    model_config = ConfigDict(extra="forbid")

    metric: str
    """Key in the harness's sample dict (the task's metric for `gain`)."""
    below: float | None = None
    above: float | None = None
    gain: float | None = None
    """At least this improvement factor over baseline (1.5: 1.5x faster), shown at 95%."""

    @model_validator(mode="after")
    def _one(self) -> Target:
        if sum(v is not None for v in (self.below, self.above, self.gain)) != 1:
            raise ValueError(f"target '{self.metric}' sets exactly one of below, above, gain")
        return self


class Knob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["int", "float", "choice", "bool"]
    default: Any
    choices: list[Any] | None = None
    """Allowed values for 'choice' (and optionally int)."""
    min: float | None = None
    max: float | None = None
    log: bool = False
    """Search on a log scale (sizes, counts)."""
    help: str = ""
    needs_gpu: bool = False

    def validate_value(self, name: str, value: Any) -> Any:
        """Return `value` coerced to this knob's type, or raise UserError naming the knob."""
        if self.type == "bool":
            if not isinstance(value, bool):
                raise UserError(f"knob '{name}': expected true or false, got {value!r}")
            return value
        if self.type == "choice" or self.choices is not None:
            if value not in (self.choices or []):
                raise UserError(f"knob '{name}': {value!r} is not one of {self.choices}")
            return value
        kind = int if self.type == "int" else float
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"knob '{name}': expected a number, got {value!r}")
        if kind is int and float(value) != int(value):
            raise UserError(f"knob '{name}': expected an integer, got {value!r}")
        value = kind(value)
        if self.min is not None and value < self.min:
            raise UserError(f"knob '{name}': {value} is below the minimum {self.min}")
        if self.max is not None and value > self.max:
            raise UserError(f"knob '{name}': {value} is above the maximum {self.max}")
        return value


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    call_timeout_s: float = 60.0
    """Wall-clock limit for one call into candidate code."""
    experiment_timeout_s: float = 600.0
    """Wall-clock limit for a whole experiment."""
    memory_mb: int = 4096
    """Memory (address space) limit of the candidate process."""
    cpu_time_s: int = 900
    min_samples: int = 8
    """Minimum samples per arm before a performance verdict."""
    max_samples: int = 40
    """Sampling stops here even if the confidence interval is still wide."""
    measure_budget_s: float = 60.0
    """Time budget for the performance stage (adaptive stopping)."""
    target_ci_width: float = 0.04
    """Stop sampling once the 95% CI of the speedup is narrower than this (relative)."""
    correctness_checks: int = 3
    """Fresh inputs checked in the correctness stage."""


class Tolerance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    atol: float | None = None
    """Absolute tolerance; None: torch.testing.assert_close's default for the dtype."""
    rtol: float | None = None
    f64_factor: float = 1.5
    """Candidate error vs float64 may exceed baseline's by at most this factor (dynamo's rule)."""
    f64_floor: float = 0.0
    """Errors vs float64 below this are treated as equal (precision floor)."""


class WorkspaceSpec(BaseModel):
    """Where the code under optimization is: the task's `workspace/` folder (the default) or an
    installed package, whole and read-only, with the task's fault injected (`tasks.tree`)."""

    model_config = ConfigDict(extra="forbid")

    package: str | None = None
    """An installed package that is the workspace, e.g. 'sglang' (paths like 'sglang/srt/...').
    None: the task's own workspace/ folder."""
    version: str | None = None
    """The package's version the task was written against (required with `package`)."""
    inject: str | None = None
    """A unified diff against the package applied to make the baseline (a fault), relative to
    the task folder; hidden from the agent like reference.patch. Default: inject.patch when the
    file exists."""

    @model_validator(mode="after")
    def _check(self) -> WorkspaceSpec:
        if self.package is not None and not self.version:
            raise ValueError(f"package '{self.package}' needs the version the task pins")
        if self.package is None and (self.version or self.inject):
            raise ValueError("version and inject need a package")
        return self


class Fault(BaseModel):
    """Where an injected fault comes from (for people and reports; never read by a harness)."""

    model_config = ConfigDict(extra="forbid")

    upstream: str | None = None
    """The merged upstream pull request whose fix the injection reverses (its URL), if any."""
    failure_class: str = ""
    """The failure class of the public case it reproduces, e.g. 'GIL starvation'."""
    sites: list[str] = []
    """For a fault that is the engine's own code (no inject.patch): the functions it lives in,
    'module path::function' (e.g. 'sglang/srt/managers/schedule_batch.py::tail_str'), for
    telling a win at the fault from one elsewhere (`tasks.sites`)."""

    @field_validator("sites")
    @classmethod
    def _sites_named(cls, sites: list[str]) -> list[str]:
        for site in sites:
            path, _, function = site.partition("::")
            if not path.endswith(".py") or not function.isidentifier():
                raise ValueError(f"fault site {site!r} is not 'module path.py::function'")
        return sites


class OpenGoal(BaseModel):
    """An open task: the unmodified engine, no planted fault, and a gain to reach with a code
    change (the task's `[[targets]]` gain on its metric). Records the best result known so far,
    so that a run beating it can be recorded as such."""

    model_config = ConfigDict(extra="forbid")

    best_known: float = Field(gt=1.0)
    """The best gain on the task's metric measured so far, as the verdict states it (median
    ratio of an IMPROVED experiment, oriented so > 1 is better), e.g. 1.62."""
    best_known_by: str = Field(min_length=1)
    """What reached it, for people: 'reference.patch (2026-12-05)', a run id."""


class TaskManifest(BaseModel):
    """The parsed `task.toml`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    title: str = ""
    story: str
    """One paragraph: symptom, where it comes from, what 'fixed' means."""
    objective: Objective
    objectives: list[Objective] = Field(default_factory=list)
    metric: Metric
    constraints: list[Constraint] = Field(default_factory=list)
    targets: list[Target] = Field(default_factory=list)
    """What the story calls fixed, as numbers (stated with every verdict, not deciding it)."""
    editable: list[str]
    """Glob patterns (relative to workspace/) a patch may modify."""
    knobs: dict[str, Knob] = Field(default_factory=dict)
    budget: Budget = Field(default_factory=Budget)
    tolerance: Tolerance = Field(default_factory=Tolerance)
    plausible_speedup: float | None = None
    """Speedups above this are flagged `suspicious` and forced to human review."""
    min_effect: float = 0.02
    """Relative change below which a difference counts as NO_CHANGE even if significant."""
    allow: list[str] = Field(default_factory=list)
    """Static-rule groups this task's code legitimately needs (e.g. 'threading', 'ctypes'), and
    'background' where threads may outlive a call and work between calls."""
    inplace: bool = False
    """The task's functions write into their arguments: a call that changes its inputs is then
    allowed (otherwise it is INCORRECT)."""
    invariants: dict[str, str] = Field(default_factory=dict)
    """Properties the harness checks on every correctness pass, name -> what must hold (e.g.
    'a step returns only after its transfer completed'). A candidate that breaks one is
    INCORRECT; the baseline may break one (the bug a task asks to fix), which is recorded."""
    harness: str = "harness.py"
    """Harness module file, relative to the task folder."""
    harness_class: str = "TaskHarness"
    kind: Literal["python", "serving"] = "python"
    """'python': candidate code runs in an RPC worker; 'serving': the harness runs a server."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Scale parameters (sizes, load, duration) with their CI defaults; overridable per run."""
    tags: list[str] = Field(default_factory=list)
    workspace: WorkspaceSpec = Field(default_factory=WorkspaceSpec)
    fault: Fault | None = None
    """An injected fault's origin (tasks with inject.patch)."""
    open: OpenGoal | None = None
    """An open task (no planted fault): the best result known for its gain target."""

    @model_validator(mode="after")
    def _check(self) -> TaskManifest:
        if not self.objectives:
            self.objectives = [self.objective]
        for name, knob in self.knobs.items():
            knob.validate_value(name, knob.default)
        for target in self.targets:
            if target.gain is not None and target.metric != self.metric.name:
                raise ValueError(f"a gain target is on the task's metric '{self.metric.name}'")
        if self.open is not None:
            if self.fault is not None or self.workspace.inject is not None:
                raise ValueError("an open task has no planted fault: drop [fault] or [open]")
            if not any(t.gain is not None for t in self.targets):
                raise ValueError("an open task states its goal as a [[targets]] gain on its metric")
        return self

    @property
    def gain_target(self) -> float | None:
        """The gain the task's targets ask for on its metric (the largest), or None."""
        gains = [t.gain for t in self.targets if t.gain is not None]
        return max(gains) if gains else None


class Task(BaseModel):
    """A loaded task: its manifest and where its folder is."""

    manifest: TaskManifest
    root: Path

    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def workspace(self) -> Path:
        """The task's own workspace/ folder (absent when an installed package is the workspace:
        read it through `tasks.tree.workspace_tree`)."""
        return self.root / "workspace"

    @property
    def inject_patch(self) -> Path | None:
        """The fault applied to an installed package to make the baseline, if the task has one."""
        spec = self.manifest.workspace
        if spec.package is None:
            return None
        path = self.root / (spec.inject or "inject.patch")
        return path if path.is_file() else None

    @property
    def wrong_fix_patch(self) -> Path | None:
        path = self.root / "wrong_fix.patch"
        return path if path.is_file() else None

    @property
    def harness_path(self) -> Path:
        return self.root / self.manifest.harness

    @property
    def reference_patch(self) -> Path | None:
        path = self.root / "reference.patch"
        return path if path.is_file() else None


def load_task(folder: Path) -> Task:
    """Load and validate a task folder; raise UserError naming the file and field on any problem."""
    path = folder / MANIFEST_FILENAME
    if not path.is_file():
        raise UserError(f"{folder}: not a task folder (no {MANIFEST_FILENAME})")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from exc
    try:
        manifest = TaskManifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UserError(f"{path}: field '{where}': {first['msg']}") from exc
    workspace = folder / "workspace"
    package = manifest.workspace.package
    if package is not None:
        if workspace.exists():
            raise UserError(
                f"{folder}: the task's workspace is the installed package '{package}'; a "
                "workspace/ folder beside it would be ignored (remove it)"
            )
        inject = manifest.workspace.inject
        if inject is not None and not (folder / inject).is_file():
            raise UserError(f"{path}: field 'workspace.inject': file '{inject}' not found")
        if manifest.open is not None and (folder / "inject.patch").is_file():
            raise UserError(
                f"{path}: field 'open': an open task has no planted fault, but "
                "inject.patch is there (remove it, or the [open] table)"
            )
    elif not workspace.is_dir():
        raise UserError(f"{folder}: task has no workspace/ folder")
    elif not any(p.is_file() for p in workspace.rglob("*")):
        # git does not keep empty folders: a task that works here would vanish from a clone
        raise UserError(f"{folder}: task workspace/ has no files")
    if not (folder / manifest.harness).is_file():
        raise UserError(f"{path}: harness file '{manifest.harness}' not found")
    return Task(manifest=manifest, root=folder.resolve())
