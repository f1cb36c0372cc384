"""A checked patch: a patch applied once to a copy of its task's workspace, the result kept and
reused by the experiment's refusal check and static stage instead of applying it again."""

from __future__ import annotations

import difflib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from infra_agent.errors import UserError
from infra_agent.experiments.arms import patch_refusal
from infra_agent.experiments.cascade import Experiment
from infra_agent.store import open_store
from infra_agent.tasks import patch as patch_module
from infra_agent.tasks.checked import check_patch
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.patch import knob_patch, parse_diff
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

PYTASK = Path(__file__).parents[1] / "experiments" / "pytask"


@pytest.fixture
def task(tmp_path: Path) -> Any:
    shutil.copytree(PYTASK, tmp_path / "pytask")
    (tmp_path / "pytask" / "workspace" / "frozen.py").write_text("X = 1\n")
    return load_task(tmp_path / "pytask")


def _diff(task: Any, rel: str, new: str) -> str:
    old = (task.workspace / rel).read_text().splitlines(keepends=True)
    return "".join(difflib.unified_diff(old, new.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"))


def test_a_diff_is_checked_into_its_files_before_and_after(task: Any) -> None:
    source = (task.workspace / "kernel.py").read_text()
    patch = parse_diff(_diff(task, "kernel.py", source + "\n# checked\n"))
    found = check_patch(patch, task)
    assert found.refusal is None and found.hash == patch.hash and found.task == task.name
    (file,) = found.files
    assert (file.path, file.before, file.mode) == ("kernel.py", source.encode(), "100644")
    assert file.after == (source + "\n# checked\n").encode()
    assert found.knobs == {}  # the test task has no knobs: the defaults are empty


def test_refusals_are_kept_with_the_reason_each_caller_gives(task: Any) -> None:
    not_editable = check_patch(parse_diff(_diff(task, "frozen.py", "X = 2\n")), task)
    assert not_editable.not_editable
    assert patch_refusal(not_editable, task) is None  # a rule: the cascade rejects it
    stale = parse_diff("--- a/kernel.py\n+++ b/kernel.py\n@@ -1 +1 @@\n-nothing like this\n+x\n")
    found = check_patch(stale, task)
    assert found.refusal is not None and not found.not_editable
    assert patch_refusal(found, task) == str(found.refusal)
    assert str(found.refusal).startswith("patch does not apply cleanly")
    with pytest.raises(UserError, match="does not apply cleanly"):
        found.accepted()
    knobs = check_patch(knob_patch({"nope": 1}), task)
    assert patch_refusal(knobs, task) == str(knobs.refusal)
    assert "unknown knob 'nope'" in str(knobs.refusal)


def test_a_proposed_patch_is_applied_to_a_copy_once(
    task: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """propose_patch checks it; the experiment's refusal check and static stage read that check."""
    applied = []  # every `git apply --check` of a patch, whoever applies it
    real = patch_module.git_apply

    def counted(diff: str, root: Path, **kw: Any) -> Any:
        applied.extend([diff] if kw.get("check") else [])
        return real(diff, root, **kw)

    monkeypatch.setattr(patch_module, "git_apply", counted)
    ctx = ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="run-checked")
    source = (task.workspace / "kernel.py").read_text()
    args = {"diff": _diff(task, "kernel.py", source + "\n# proposed\n"), "rationale": "r"}
    result = default_registry().call("propose_patch", json.dumps(args), ctx)
    assert result.data is not None, result.content
    found = ctx.checked_patch(result.data["patch_id"])
    assert patch_refusal(found, task) is None
    experiment = Experiment(task, found, backend="local", params={}, progress=None, bootstrap_seed=0)  # fmt: skip
    experiment.static()  # reads the files the check applied
    assert len(applied) == 1
    with pytest.raises(UserError, match="checked against task"):
        Experiment(find_task("decode-split-norm"), found, backend="local", params={},
                   progress=None, bootstrap_seed=0)  # fmt: skip
