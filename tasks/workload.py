"""What an experiment measures, published: `Workload`, the inputs a harness feeds the code.

A harness knows the shapes, dtypes and parameters it measures on and how it draws its seeds;
`Harness.workload(knobs)` says so in a typed record, with a ready `setup` (Python run in a copy
of the workspace, no harness needed) that builds inputs of the same shapes and distributions and
the `call` the experiment times on them. The `microbench` and `accuracy_diff` tools default to
it, so cheap checks run on what `run_experiment` will measure; `describe_task` shows `render()`.
The setup's values are not the experiment's: it uses its own fixed seeds (see `seeds`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

WORKLOAD_VERSION = 1

F64Error = Literal["max_abs", "rel_rms", "max_rel"]
"""How a harness measures an arm's error against float64 (what `f64_factor` compares)."""


class InputSpec(BaseModel):
    """One input the experiment feeds the code."""

    name: str
    shape: list[int]
    dtype: str
    what: str = ""
    """In words, e.g. 'keys of the KV cache'."""

    def render(self) -> str:
        text = f"{self.name} {self.dtype}{self.shape}"
        return f"{text} ({self.what})" if self.what else text


class Workload(BaseModel):
    """The experiment's measurement inputs and a ready setup for cheap checks on them."""

    version: int = WORKLOAD_VERSION
    summary: str
    """One line: what one measured sample is, e.g. '4 decode steps over a 2048-token cache'."""
    inputs: list[InputSpec] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)
    """The task's scale parameters for this run."""
    knobs: dict[str, Any] = Field(default_factory=dict)
    """Knob values the `call` uses."""
    seeds: str
    """The seeds policy in words: what is fresh per check/sample, what the setup uses."""
    metric: str = ""
    """What the experiment's timer or counter measures around `call`."""
    setup: str = ""
    """Python run once in a copy of the workspace that builds the inputs ('' when the task
    publishes none, e.g. a serving task)."""
    call: str = ""
    """The expression the experiment measures, using the names `setup` defines."""
    reference: str = ""
    """A float64 reference expression for `call`'s output ('' when none)."""
    f64_error: F64Error = "max_abs"
    """How the experiment measures an arm's error against float64 (what the task's f64_factor
    compares between candidate and baseline)."""
    atol: float | None = None
    """Element-wise tolerance the harness checks outputs with: |out - ref| <= atol + rtol·|ref|
    (None: no element-wise check, e.g. only the float64 rule)."""
    rtol: float | None = None

    @property
    def ready(self) -> bool:
        """Whether the tools can run `call` after `setup` without further input."""
        return bool(self.setup and self.call)

    def render(self) -> str:
        """A few lines for a model: what is measured, on which inputs, with which seeds."""
        lines = [f"workload: {self.summary}"]
        if self.inputs:
            lines.append("inputs: " + "; ".join(i.render() for i in self.inputs))
        if self.params:
            lines.append("parameters: " + ", ".join(f"{k}={v!r}" for k, v in self.params.items()))
        if self.call:
            lines.append(
                f"measured call: {self.call}" + (f" ({self.metric})" if self.metric else "")
            )
        lines.append(f"seeds: {self.seeds}")  # the tools that run on it say so themselves
        return "\n".join(lines)


DEFAULT_SEEDS = (
    "run_experiment draws fresh random seeds for every correctness check and timed sample; "
    "the code never sees them"
)
