"""Open tasks (`[open]` in task.toml): the unmodified engine, no planted fault, a gain target and
the best result known; a malformed one is refused naming the field, and `tasks check` asks no
symptom of one and states the reference's number beside the best known."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra_agent.errors import UserError
from infra_agent.experiments import run as run_module
from infra_agent.experiments.check import check_task
from infra_agent.store.verdict import Verdict
from infra_agent.tasks import registry
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.registry import find_task, list_tasks

OPEN = """
[open]
best_known = 1.4
best_known_by = "reference.patch"

[[targets]]
metric = "latency_ms"
gain = 1.2
"""


def open_copy(tmp_path: Path, extra: str = OPEN) -> Path:
    """example-matmul (a python task with a reference fix) as an open task named 'mine'."""
    folder = tmp_path / "mine"
    shutil.copytree(registry.BUNDLED_DIR / "example-matmul", folder)
    toml = folder / "task.toml"
    text = toml.read_text().replace('name = "example-matmul"', 'name = "mine"')
    toml.write_text(text.replace("[metric]", extra + "\n[metric]", 1))
    return folder


def test_bundled_open_tasks_state_a_goal_and_plant_nothing() -> None:
    found = [t for t in list_tasks(search_path=[]) if t.manifest.open is not None]
    assert {"sglang-open-cpu-batch-job", "sglang-open-cpu-shared-prompt"} <= {t.name for t in found}
    for task in found:
        goal = task.manifest.open
        assert goal is not None and goal.best_known > 1.0 and goal.best_known_by
        assert task.manifest.gain_target is not None and task.manifest.gain_target >= 1.10
        assert task.inject_patch is None and task.manifest.fault is None
        assert task.reference_patch is not None, f"{task.name}: the best known fix is missing"
        assert "open" in task.manifest.tags


def test_an_open_task_loads(tmp_path: Path) -> None:
    task = load_task(open_copy(tmp_path))
    assert task.manifest.open is not None and task.manifest.open.best_known == 1.4
    assert task.manifest.gain_target == 1.2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[open]\nbest_known = 1.4\nbest_known_by = "x"\n', "a \\[\\[targets\\]\\] gain"),
        (OPEN.replace("1.4", "0.9"), "field 'open.best_known'"),
        (OPEN.replace('best_known_by = "reference.patch"', ""), "field 'open.best_known_by'"),
        (OPEN.replace("best_known = 1.4", "best_known = 1.4\nbest = 2"), "field 'open.best'"),
        (OPEN + '\n[fault]\nfailure_class = "x"\n', "no planted fault"),
    ],
    ids=["no-gain-target", "best-not-a-gain", "no-best-by", "unknown-field", "with-fault"],
)
def test_a_malformed_open_task_is_refused(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        find_task(str(open_copy(tmp_path, extra)))


def test_an_open_task_with_an_inject_patch_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    shutil.copytree(registry.BUNDLED_DIR / "sglang-open-cpu-batch-job", folder)
    (folder / "inject.patch").write_text((folder / "reference.patch").read_text())
    with pytest.raises(UserError, match="field 'open': .*inject.patch is there"):
        load_task(folder)


def test_check_asks_no_symptom_and_states_the_best_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference's experiment is a stand-in (the check's logic, not a measurement)."""
    perf = SimpleNamespace(
        metric="latency_ms", speedup=1.3, ci_low=1.25, ci_high=1.35,
        baseline_median=2.0, candidate_median=1.54, unit="ms",
    )  # fmt: skip
    record = SimpleNamespace(
        id="exp-1",
        result=SimpleNamespace(
            verdict=Verdict.IMPROVED, reasons=[], evidence=SimpleNamespace(performance=perf)
        ),
    )
    ran: list[str] = []
    monkeypatch.setattr(run_module, "run_experiment", lambda task, patch, **_: ran.append(patch.author) or record)  # fmt: skip
    result = check_task(load_task(open_copy(tmp_path)))
    rows = {row.question: row for row in result.rows}
    assert ran == ["tasks check"], "only the reference is measured"
    assert rows["symptom"].ok is None and "no planted fault" in rows["symptom"].number
    assert rows["reference"].ok and "target 1.2x, best known 1.4x (reference.patch)" in rows["reference"].number  # fmt: skip
    assert rows["wrong fix"].ok is None and result.passed
