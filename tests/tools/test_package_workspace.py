"""A serving task's workspace through the agent's tools: the whole installed SGLang package,
with the task's injected fault in it, the fault's patch and the install itself out of reach."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import needs_sglang_env

from infra_agent.store import open_store
from infra_agent.tasks.manifest import load_task
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

pytestmark = needs_sglang_env()
SAMPLER = "sglang/srt/layers/sampler.py"


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    from infra_agent.serving.overlay import installed_package

    folder = tmp_path / "mine"
    shutil.copytree(find_task("sglang-cpu-tiny").root, folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace('name = "sglang-cpu-tiny"', 'name = "mine"'))
    lines = (installed_package().parent / SAMPLER).read_text().splitlines(keepends=True)
    (folder / "inject.patch").write_text(
        f"--- a/{SAMPLER}\n+++ b/{SAMPLER}\n@@ -1,3 +1,4 @@\n"
        + f" {lines[0]}+FAULT_MARK = 1\n"
        + "".join(" " + line for line in lines[1:3])
    )
    return ToolContext(task=load_task(folder), store=open_store(tmp_path / "runs.db"), run_id="r")


def call(ctx: ToolContext, name: str, **args: object) -> str:
    result = default_registry().call(name, json.dumps(args), ctx)
    assert result.error is None, result.error
    return result.content


def test_any_sglang_module_can_be_listed_read_and_searched(ctx: ToolContext) -> None:
    top = call(ctx, "list_files")
    assert "files match" in top and "sglang/" in top  # summarized by folder, not 200 names
    managers = call(ctx, "list_files", pattern="sglang/srt/managers/*.py")
    assert "sglang/srt/managers/scheduler.py  (editable)" in managers
    text = call(ctx, "read_file", path="sglang/srt/managers/scheduler.py", max_lines=5)
    assert text.startswith("sglang/srt/managers/scheduler.py: lines 1-5 of ")
    hits = call(ctx, "search_files", regex=r"class Scheduler\b", pattern="sglang/srt/**/*.py")
    assert "sglang/srt/managers/scheduler.py:" in hits


def test_the_injected_fault_is_simply_part_of_the_code(ctx: ToolContext) -> None:
    assert "FAULT_MARK = 1" in call(ctx, "read_file", path=SAMPLER, max_lines=3)
    assert "FAULT_MARK" in call(ctx, "search_files", regex="FAULT_MARK", pattern="*.py")
    for hidden in ("../inject.patch", "inject.patch", "../sglang-0.5.23.dist-info/RECORD"):
        result = default_registry().call("read_file", json.dumps({"path": hidden}), ctx)
        assert result.error and (
            "outside the task workspace" in result.error or "no file" in result.error
        )


def test_edit_file_edits_the_package_tree_as_the_agent_sees_it(ctx: ToolContext) -> None:
    """Edits in a package workspace: one in the injected file (against its injected content),
    one in another module; the patch covers both and applies to the baseline tree."""
    from infra_agent.tasks.tree import preview_apply

    first = default_registry().call(
        "edit_file", json.dumps({"path": SAMPLER, "old": "FAULT_MARK = 1\n", "new": ""}), ctx
    )
    assert first.error is None, first.error
    scheduler = "sglang/srt/managers/scheduler.py"
    second = default_registry().call(
        "edit_file",
        json.dumps(
            {"path": scheduler, "old": "class Scheduler(", "new": "class Scheduler(  # x\n"}
        ),
        ctx,
    )
    assert second.error is None and second.data is not None, second.error
    patch = ctx.patch(second.data["patch_id"])
    assert patch.files == sorted([SAMPLER, scheduler])
    assert "-FAULT_MARK = 1" in patch.diff
    scratch = preview_apply(patch, ctx.task)
    try:
        assert "FAULT_MARK" not in (scratch / "ws" / SAMPLER).read_text()
        assert "class Scheduler(  # x" in (scratch / "ws" / scheduler).read_text()
    finally:
        shutil.rmtree(scratch)
