"""edit_file: exact search-and-replace that yields the same checked patches as propose_patch;
edits accumulate into one candidate; a diff that does not apply shows what the file has."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tasks.tree import preview_apply
from infra_agent.tools.base import ToolResult
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

HOIST_1 = {  # compute the normalizer once, before the split loop ...
    "path": "attention.py",
    "old": "    out = torch.zeros_like(q)\n    for start, end",
    "new": "    out = torch.zeros_like(q)\n    row_max, row_sum = _row_normalizer(q, k, scale)\n"
    "    for start, end",
}
HOIST_2 = {  # ... and no longer in it
    "path": "attention.py",
    "old": "        row_max, row_sum = _row_normalizer(q, k, scale)\n        for page",
    "new": "        for page",
}


def _ctx(tmp_path: Path, task: str = "decode-split-norm") -> ToolContext:
    store = open_store(tmp_path / "runs.db")
    return ToolContext(task=find_task(task), store=store, run_id="run-edit")


def _call(ctx: ToolContext, name: str, **args: object) -> ToolResult:
    return default_registry().call(name, json.dumps(args), ctx)


def _patched(ctx: ToolContext, patch_id: str, rel: str) -> str:
    scratch = preview_apply(ctx.patch(patch_id), ctx.task)
    try:
        return (scratch / "ws" / rel).read_text()
    finally:
        shutil.rmtree(scratch)


def test_edits_accumulate_into_one_checked_patch(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    baseline = (ctx.task.workspace / "attention.py").read_text()
    first = _call(ctx, "edit_file", **HOIST_1, rationale="hoist the normalizer")
    assert first.error is None and first.data is not None, first.content
    assert "built on the baseline" in first.content and "run_experiment" in first.content
    # What was registered, counted and shown (a relay run read 'diff of 32 lines' for 6 lines).
    assert "the patch against the baseline: +1 -0 lines in 1 file)" in first.content
    assert "\n+    row_max, row_sum = _row_normalizer(q, k, scale)\n" in first.content
    second = _call(ctx, "edit_file", **HOIST_2)
    assert second.error is None and second.data is not None, second.content
    assert f"built on {first.data['patch_id'][:12]}" in second.content
    assert first.data["base"] is None and second.data["base"] == first.data["patch_id"]
    patch_id = second.data["patch_id"]
    assert ctx.known_patches == [first.data["patch_id"], patch_id]
    text = _patched(ctx, patch_id, "attention.py")  # the stored diff applies to the baseline
    assert text == baseline.replace(HOIST_1["old"], HOIST_1["new"]).replace(
        HOIST_2["old"], HOIST_2["new"]
    )
    assert ctx.patch(patch_id).rationale == "hoist the normalizer"
    fresh = _call(ctx, "edit_file", **HOIST_2, base="baseline")  # a new candidate
    assert fresh.data is not None and fresh.data["patch_id"] not in (
        first.data["patch_id"],
        patch_id,
    )
    assert _patched(ctx, fresh.data["patch_id"], "attention.py") == baseline.replace(
        HOIST_2["old"], HOIST_2["new"]
    )


def test_edit_errors_name_the_matches_or_the_closest_lines(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    twice = _call(ctx, "edit_file", **HOIST_1)
    assert twice.error is None
    again = _call(
        ctx, "edit_file", path="attention.py", old="row_max, row_sum = _row_normalizer(q, k, scale)",
        new="pass",
    )  # fmt: skip
    assert again.error and "matches 2 times" in again.error and "lines 51, 54" in again.error
    missing = _call(
        ctx, "edit_file", path="attention.py",
        old="    for start, end in split_bounds(k.shape[2], num_splits, blocksize):", new="x",
    )  # fmt: skip
    assert missing.error and "matches 0 times" in missing.error
    assert "closest lines" in missing.error and "split_bounds(k.shape[2]" in missing.error
    indented = _call(
        ctx, "edit_file", path="attention.py", old="\tout = torch.zeros_like(q)", new=""
    )
    assert indented.error and "matches 0 times" in indented.error  # a tab, not four spaces
    assert "differ from old only in indentation" in indented.error
    assert "   50      out = torch.zeros_like(q)" in indented.error
    assert ctx.known_patches == [twice.data["patch_id"]] if twice.data else False
    gil = _ctx(tmp_path / "gil", "kv-transfer-gil")
    refused = _call(gil, "edit_file", path="scheduler.py", old="import", new="import")
    assert refused.error and "not editable" in refused.error and "dispatch.py" in refused.error
    outside = _call(gil, "edit_file", path="../harness.py", old="a", new="b")
    assert outside.error and "no file '../harness.py'" in outside.error


def test_a_diff_that_does_not_apply_shows_expected_next_to_actual_lines(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    diff = (
        "--- a/attention.py\n+++ b/attention.py\n@@ -50,4 +50,3 @@\n"
        "     out = torch.zeros_like(q)\n"
        "     for start, end in split_bounds(k.shape[2], num_splits, block_size):\n"
        "         # Each split normalizes with the global statistics.\n"  # not the real comment
        "-        row_max, row_sum = _row_normalizer(q, k, scale)\n"
    )
    result = _call(ctx, "propose_patch", diff=diff, rationale="hoist")
    assert result.error and "does not apply cleanly" in result.error
    assert "hunk 1 of 1 (attention.py @@ -50,4 +50,3 @@)" in result.error
    assert "!         # Each split normalizes with the global statistics." in result.error
    assert "   52          # Each split normalizes its probabilities" in result.error
    assert "attention.py has at lines 50-53" in result.error
    assert len(result.error) < 2000


@pytest.mark.parametrize("total", [1070])
def test_read_file_says_which_lines_it_really_shows(tmp_path: Path, total: int) -> None:
    folder = tmp_path / "task"
    shutil.copytree(find_task("decode-split-norm").root, folder)
    long_line = "x = 'a long line of code that fills the answer quickly' + str(40)"
    (folder / "workspace" / "attention.py").write_text(
        "\n".join(f"{long_line}  # {i}" for i in range(1, total + 1)) + "\n"
    )
    ctx = ToolContext(task=find_task(str(folder)), store=open_store(tmp_path / "r.db"), run_id="r")
    result = _call(ctx, "read_file", path="attention.py", max_lines=400)
    assert result.error is None and result.data is not None
    end = result.data["end_line"]
    assert 50 < end < 400
    head, *body = result.content.split("\n")
    cap = "(asked for 400; one answer holds at most 16,000 characters)"
    assert (
        head == f"attention.py: lines 1-{end} of {total} {cap}; continue with start_line={end + 1}"
    )
    assert body[-1].endswith(f"# {end}") and len(body) == end  # whole lines, as announced
    assert "more characters cut" not in result.content  # the registry did not have to cut
    tail = _call(ctx, "read_file", path="attention.py", start_line=total - 4, max_lines=400)
    assert tail.content.split("\n")[0] == f"attention.py: lines {total - 4}-{total} of {total}"
    past = _call(ctx, "read_file", path="attention.py", start_line=total + 5)
    assert past.error and f"past the end of attention.py ({total} lines)" in past.error


@pytest.mark.slow
def test_an_edit_file_patch_is_verified_like_any_other(tmp_path: Path) -> None:
    """Verification is unchanged: the patch_id two edits built goes through the experiment's
    correctness and timing stages (hoisting the normalizer: keys read twice instead of 5 times)."""
    from support import quick_decode_task

    from infra_agent.experiments.run import run_experiment
    from infra_agent.tasks.manifest import load_task

    task = load_task(quick_decode_task(tmp_path))
    ctx = ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="run-edit")
    _call(ctx, "edit_file", **HOIST_1)
    done = _call(ctx, "edit_file", **HOIST_2, rationale="hoist the normalizer")
    assert done.data is not None, done.content
    record = run_experiment(task, ctx.patch(done.data["patch_id"]), store=ctx.store)
    result = record.result
    assert result.verdict.value not in ("INCORRECT", "REJECTED", "FAILED"), result.render()
    assert result.evidence.stage_reached != "apply"


def test_an_edit_that_leaves_a_name_undefined_is_registered_with_a_warning(tmp_path: Path) -> None:
    """A relay run's first half-edit left `per_req_query_padded` undefined and was answered
    'applies cleanly'; an experiment on it would have failed. The answer now warns (and still
    registers the patch: the next edit may complete it); a problem the file had before is not
    the patch's, and a clean edit gets no warning."""
    ctx = _ctx(tmp_path)
    clean = _call(ctx, "edit_file", **HOIST_1, rationale="hoist the normalizer")
    assert clean.data is not None and "warning" not in clean.content
    old = "    out = torch.zeros_like(q)\n"
    broken = _call(ctx, "edit_file", path="attention.py", old=old, new="    out = torch.zeros_like(q_padded)\n", base="baseline")  # fmt: skip
    assert broken.error is None and broken.data is not None, broken.content
    line = 1 + (ctx.task.workspace / "attention.py").read_text().split(old)[0].count("\n")
    assert (
        f"warning: the patched code would fail when run: attention.py:{line}: undefined name "
        "'q_padded'" in broken.content
    ), broken.content
    syntax = _call(ctx, "edit_file", path="attention.py", old=old, new="    out = torch.zeros_like(q\n", base="baseline")  # fmt: skip
    assert syntax.data is not None and "syntax error" in syntax.content, syntax.content


def test_lint_counts_only_what_the_patch_adds() -> None:
    from infra_agent.tools.lint import new_problems, render

    before = "def f():\n    return y\n"
    after = "import os\n\n\ndef f():\n    return y + w\n"  # y was undefined before; os unused
    assert new_problems({"m.py": (before, after), "notes.txt": (None, "w")}) == [
        "m.py:5: undefined name 'w'"
    ]
    assert new_problems({"new.py": (None, "print(v)\n")}) == ["new.py:1: undefined name 'v'"]
    assert render([]) == "" and render([f"m.py:{i}: x" for i in range(7)]).endswith("(and 2 more)")


def test_one_edit_changes_several_places_of_a_file(tmp_path: Path) -> None:
    """A relay run repeated 25 unchanged lines to change two places of one function: `also`
    carries more replacements, applied in order, each matching once; one that does not match
    names itself and changes nothing."""
    ctx = _ctx(tmp_path)
    baseline = (ctx.task.workspace / "attention.py").read_text()
    both = _call(ctx, "edit_file", **HOIST_1, also=[{"old": HOIST_2["old"], "new": HOIST_2["new"]}])
    assert both.error is None and both.data is not None, both.content
    text = _patched(ctx, both.data["patch_id"], "attention.py")
    assert text == baseline.replace(HOIST_1["old"], HOIST_1["new"]).replace(
        HOIST_2["old"], HOIST_2["new"]
    )
    missing = _call(ctx, "edit_file", **HOIST_1, base="baseline", also=[{"old": "no such text", "new": ""}])  # fmt: skip
    assert missing.error is not None and missing.data is None
    assert missing.content.startswith(
        "error: edit_file: also[0].old matches 0 times in attention.py (as in the baseline after the 1 "
        "replacement before it)"
    ), missing.content
    assert ctx.known_patches == [both.data["patch_id"]]
