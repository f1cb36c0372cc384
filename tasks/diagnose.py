"""What a diagnosis finds: a task's symptom reproduced and localized, changing no code.

The "reproduce -> localize" half of the method, usable on its own (`infra-agent diagnose`, run
by `experiments.diagnose`): the task's baseline workspace runs in a sandbox with an RPC worker
exactly as in an experiment; the task's harness (trusted) reproduces the symptom with fixed
seeds and applies the instruments that fit it:

- accuracy tasks: `feedback.accuracy.compare_paths` stage by stage against float64 or between
  batch shapes (the first divergence names the stage), and the error's growth with size;
- GIL tasks: `feedback.gil` samples the worker's threads (who holds the GIL, who waits, where);
- correctness-under-load tasks: a seeded stress run whose every output the harness checks, and
  `feedback.timeline` overlap where the fix must keep it;
- serving tasks (a live SGLang server): profiles of the server's processes under the workload,
  GIL traces, accuracy probes and outputs under load against the same requests alone
  (`serving/instruments/diagnosis.py`).

A harness opts in with a method `diagnose(self, arm) -> Diagnosis`; tasks without one get the
generic diagnosis (correctness check and a few samples of the metric).
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import BaseModel, Field

DIAGNOSIS_SCHEMA_VERSION = 1
DIAGNOSE_SEED = 20260
"""Fixed seed: a diagnosis reproduces the same inputs every time."""


EVIDENCE_SHOWN = 24
"""Evidence lines the text shows (the record keeps all): a serving diagnosis's GIL trace, both
loads, the processes' CPU, the scheduler's hottest functions and a busy front end's run to about
twenty; at 12 the front end's (where sglang-real-scored-stream-slowdown's fault shows, 74% of its
samples in stream_results) was cut.
"""


class Localization(BaseModel):
    """Where the instruments put the problem (any of the three may be unknown)."""

    stage: str | None = None
    """Computation stage, e.g. 'state_merge' or 'combine'."""
    thread: str | None = None
    """Thread name, e.g. 'MainThread'."""
    function: str | None = None
    """Function as 'file:function', e.g. 'dispatch.py:intranode_dispatch'."""
    detail: str = ""
    """One sentence: what happens there."""


class Diagnosis(BaseModel):
    """What `infra-agent diagnose` found: the symptom with its size, where it is, and why."""

    schema_version: int = DIAGNOSIS_SCHEMA_VERSION
    task: str = ""
    objective: str = ""
    reproduced: bool
    """Whether the symptom showed up in this run."""
    symptom: str
    """One line with the measured rate or size."""
    measured: dict[str, float] = Field(default_factory=dict)
    """The symptom's numbers, name -> value (units in the name)."""
    localization: Localization = Field(default_factory=Localization)
    divergence_point: str | None = None
    """Accuracy tasks: the first stage out of tolerance, in execution order."""
    blocking_stack: list[str] = Field(default_factory=list)
    """GIL tasks: the holder's stack, innermost frame first."""
    evidence: list[str] = Field(default_factory=list)
    """Lines with the numbers behind the localization (per-stage errors, sample shares...)."""
    instruments: list[str] = Field(default_factory=list)
    """Instruments used, e.g. ['accuracy.compare_paths', 'accuracy.error_sweep']."""
    params: dict[str, Any] = Field(default_factory=dict)
    duration_s: float = 0.0

    def render(self) -> str:
        """Short text for a person or a model: the decisive numbers first."""
        head = "REPRODUCED" if self.reproduced else "NOT REPRODUCED"
        lines = [f"{head} {self.task}: {self.symptom}"]
        loc = self.localization
        where = [
            f"{k} {v}"
            for k, v in (("stage", loc.stage), ("thread", loc.thread), ("function", loc.function))
            if v
        ]
        if where:
            lines.append(
                "localized to " + ", ".join(where) + (f": {loc.detail}" if loc.detail else "")
            )
        if self.divergence_point:
            lines.append(f"first divergence: {self.divergence_point}")
        if self.blocking_stack:
            lines.append("blocking stack: " + " <- ".join(self.blocking_stack[:6]))
        lines.extend(f"- {e}" for e in self.evidence[:EVIDENCE_SHOWN])
        if self.instruments:
            lines.append(f"instruments: {', '.join(self.instruments)} ({self.duration_s:.1f} s)")
        return "\n".join(lines)


def generic_diagnosis(harness: Any, arm: Any, samples: int = 3) -> Diagnosis:
    """For harnesses without `diagnose`: one correctness check and a few metric samples."""
    manifest = harness.manifest
    check = harness.check(arm, DIAGNOSE_SEED)
    values = [harness.sample(arm, DIAGNOSE_SEED + 1 + i) for i in range(samples)]
    metric = manifest.metric.name
    median = statistics.median(v[metric] for v in values)
    return Diagnosis(
        reproduced=not check.passed,
        symptom=f"{metric} median {median:.4g} {manifest.metric.unit} over {samples} samples; "
        f"correctness {'pass' if check.passed else 'FAIL: ' + str(check.detail)}",
        measured={metric: median},
        evidence=[f"sample {i}: {v}" for i, v in enumerate(values)],
        instruments=["harness.check", "harness.sample"],
    )
