"""Fixtures for the review queue: a small task folder in git-free tmp space and proposals on it."""

from __future__ import annotations

import json
import random
import re
import shutil
import sqlite3
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra_agent.store import RunStore, open_store
from infra_agent.store.records import ExperimentRecord, PatchRecord
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    Verdict,
)
from infra_agent.tasks.manifest import Task, load_task
from infra_agent.tasks.patch import knob_patch, parse_diff

SCHED_PY = textwrap.dedent(
    '''\
    """A toy batch scheduler."""


    def next_batch(queue, max_batch):
        batch = []
        for request in queue:
            if len(batch) >= max_batch:
                break
            batch.append(request)
        return batch
    '''
)

SCHED_DIFF = textwrap.dedent(
    """\
    --- a/scheduler.py
    +++ b/scheduler.py
    @@ -2,9 +2,5 @@


     def next_batch(queue, max_batch):
    -    batch = []
    -    for request in queue:
    -        if len(batch) >= max_batch:
    -            break
    -        batch.append(request)
    -    return batch
    +    # Slicing avoids a Python-level loop per request.
    +    return list(queue[:max_batch])
    """
)


def make_task(root: Path) -> Task:
    root.mkdir(parents=True, exist_ok=True)
    (root / "workspace").mkdir(exist_ok=True)
    (root / "workspace" / "scheduler.py").write_text(SCHED_PY)
    (root / "harness.py").write_text("class TaskHarness:\n    pass\n")
    (root / "task.toml").write_text(
        textwrap.dedent(
            """\
            name = "toy-sched"
            story = "Batch selection is slow."
            objective = "latency"
            editable = ["scheduler.py"]
            [metric]
            name = "step_time_ms"
            unit = "ms"
            higher_is_better = false
            [knobs.max_batch]
            type = "int"
            default = 8
            min = 1
            max = 256
            """
        )
    )
    return load_task(root)


def diff_patch(diff: str = SCHED_DIFF) -> PatchRecord:
    return parse_diff(diff, author="scripted-llm", rationale="slice instead of loop").to_record()


def knob_patch_record(knobs: dict[str, object]) -> PatchRecord:
    return knob_patch(knobs, author="search", rationale="bigger batches").to_record()


def measured_result(
    task: str, patch_id: str, *, speedup: float = 1.3, flags: list[Flag] | None = None
) -> ExperimentResult:
    """An ExperimentResult with per-sample timings drawn around a true speedup."""
    rng = random.Random(7)
    base = [10.0 + rng.gauss(0, 0.3) for _ in range(24)]
    cand = [10.0 / speedup + rng.gauss(0, 0.3) for _ in range(24)]
    return ExperimentResult(
        task=task,
        patch_id=patch_id,
        verdict=Verdict.IMPROVED,
        reasons=[f"step_time_ms median improved {speedup:.2f}x, CI excludes 1"],
        flags=flags or [],
        evidence=Evidence(
            stage_reached="performance",
            correctness=CorrectnessEvidence(
                passed=True, checks=3, max_abs_err=0.0, tolerance="exact",
                baseline_err_f64=1e-7, candidate_err_f64=1.1e-7,
            ),
            performance=PerformanceEvidence(
                metric="step_time_ms", unit="ms", higher_is_better=False,
                baseline_median=sorted(base)[12], candidate_median=sorted(cand)[12],
                speedup=speedup, ci_low=speedup - 0.05, ci_high=speedup + 0.05, n_samples=24,
                baseline_samples=base, candidate_samples=cand, method="ABBA interleaved, bootstrap",
            ),
            health={"repetition_rate": 0.0},
            extra={"divergence": {"first_layer": None}},
        ),
    )  # fmt: skip


def experiment_for(task: Task, patch: PatchRecord, **kw: object) -> ExperimentRecord:
    from infra_agent.experiments import task_fingerprint

    return ExperimentRecord(
        task=task.name,
        patch_id=patch.id,
        result=measured_result(task.name, patch.id, **kw),  # type: ignore[arg-type]
        target_fingerprint=task_fingerprint(task),
    )


def matmul_copy(root: Path, name: str) -> Path:
    """The bundled example-matmul task under another name, with a small measuring budget (its
    speedup is several-fold, so a few samples per arm decide it)."""
    from infra_agent.tasks.registry import find_task

    shutil.copytree(find_task("example-matmul").root, root / name)
    toml = (root / name / "task.toml").read_text()
    toml = toml.replace('name = "example-matmul"', f'name = "{name}"')
    toml = re.sub(r"min_samples = \d+", "min_samples = 4", toml)
    toml = re.sub(r"max_samples = \d+", "max_samples = 6", toml)
    toml = re.sub(r"measure_budget_s = [\d.]+", "measure_budget_s = 2.0", toml)
    (root / name / "task.toml").write_text(toml)
    return root / name


def edit_stored_patch(db: Path, patch_id: str, edit: Callable[[str], str]) -> None:
    """Edit a stored patch's diff in place, its id kept (as someone with the database file could)."""
    with sqlite3.connect(db) as conn:
        (body,) = conn.execute("SELECT body FROM patches WHERE id=?", (patch_id,)).fetchone()
        record = json.loads(body)
        record["diff"] = edit(record["diff"])
        conn.execute("UPDATE patches SET body=? WHERE id=?", (json.dumps(record), patch_id))


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return make_task(tmp_path / "toy-sched")


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return open_store(tmp_path / "runs.db")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="session")
def kit() -> SimpleNamespace:
    """The helpers above, for tests (conftest modules are not importable by name)."""
    return SimpleNamespace(
        make_task=make_task,
        diff_patch=diff_patch,
        knob_patch_record=knob_patch_record,
        measured_result=measured_result,
        experiment_for=experiment_for,
        matmul_copy=matmul_copy,
        edit_stored_patch=edit_stored_patch,
        git=git,
        SCHED_DIFF=SCHED_DIFF,
    )
