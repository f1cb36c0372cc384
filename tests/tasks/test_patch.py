"""Patches: parsing, refusal reasons, knob assignments, hashing, applying to a private copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.tasks.manifest import Task, load_task
from infra_agent.tasks.patch import (
    NotEditableError,
    PatchError,
    apply_patch,
    glob_regex,
    knob_patch,
    load_patch,
    parse_diff,
)

GOOD = """\
--- a/kernel.py
+++ b/kernel.py
@@ -1,2 +1,2 @@
 def f(x):
-    return x + 1
+    return x + 2
"""


@pytest.fixture
def task(tmp_path: Path) -> Task:
    root = tmp_path / "task"
    (root / "workspace" / "lib").mkdir(parents=True)
    (root / "workspace" / "kernel.py").write_text("def f(x):\n    return x + 1\n")
    (root / "workspace" / "lib" / "util.py").write_text("X = 1\n")
    (root / "workspace" / "frozen.py").write_text("Y = 1\n")
    (root / "harness.py").write_text("")
    (root / "task.toml").write_text(
        'name = "t"\nstory = "s"\nobjective = "latency"\neditable = ["kernel.py", "lib/**/*.py"]\n'
        '[metric]\nname = "ms"\nunit = "ms"\nhigher_is_better = false\n'
        '[knobs.size]\ntype = "int"\ndefault = 4\nmin = 1\nmax = 64\n'
        '[knobs.mode]\ntype = "choice"\ndefault = "a"\nchoices = ["a", "b"]\n'
    )
    return load_task(root)


def copy_of(task: Task, tmp_path: Path) -> Path:
    dest = tmp_path / "copy"
    shutil.copytree(task.workspace, dest)
    return dest


def test_diff_applies_to_the_copy_only(task: Task, tmp_path: Path) -> None:
    patch = parse_diff(GOOD, author="glm", rationale="faster")
    root = copy_of(task, tmp_path)
    knobs = apply_patch(patch, task, root)
    assert (root / "kernel.py").read_text().endswith("x + 2\n")
    assert (task.workspace / "kernel.py").read_text().endswith("x + 1\n")
    assert knobs == {"size": 4, "mode": "a"}
    assert patch.files == ["kernel.py"]
    record = patch.to_record()
    assert record.id == patch.hash and record.author == "glm" and record.files == ["kernel.py"]


def test_hash_is_content_only(task: Task) -> None:
    a = parse_diff(GOOD, author="x", rationale="1")
    b = parse_diff(GOOD, author="y", rationale="2")
    c = parse_diff(GOOD.replace("x + 2", "x + 3"))
    assert a.hash == b.hash != c.hash and len(a.hash) == 64
    assert knob_patch({"size": 8, "mode": "b"}).hash == knob_patch({"mode": "b", "size": 8}).hash


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("just some text\n", "not a unified diff"),
        ("--- a/kernel.py\n+++ b/kernel.py\n", "no hunks"),
        (GOOD.replace("a/kernel.py", "a/../harness.py"), "leaves the workspace"),
        (GOOD.replace("b/kernel.py", "/etc/passwd"), "leaves the workspace"),
        ("diff --git a/k.bin b/k.bin\nGIT binary patch\nliteral 1\n", "binary"),
        (
            "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/x\n",
            "symlink",
        ),  # fmt: skip
        ("diff --git a/x b/y\nrename from x\nrename to y\n", "renames"),
    ],
)
def test_malformed_patches_are_refused(text: str, reason: str) -> None:
    with pytest.raises(PatchError, match=reason):
        parse_diff(text)


def test_non_editable_missing_and_stale_patches_are_refused(task: Task, tmp_path: Path) -> None:
    root = copy_of(task, tmp_path)
    with pytest.raises(NotEditableError, match="'frozen.py', which is not editable"):
        apply_patch(parse_diff(GOOD.replace("kernel.py", "frozen.py")), task, root)
    with pytest.raises(PatchError, match="does not exist"):
        apply_patch(parse_diff(GOOD.replace("kernel.py", "lib/gone.py")), task, root)
    with pytest.raises(PatchError, match="does not apply cleanly"):
        apply_patch(parse_diff(GOOD.replace("x + 1", "x + 7")), task, root)
    assert (root / "kernel.py").read_text().endswith("x + 1\n")  # nothing half-applied


def test_new_file_under_an_editable_glob(task: Task, tmp_path: Path) -> None:
    diff = "--- /dev/null\n+++ b/lib/deep/new.py\n@@ -0,0 +1 @@\n+Z = 3\n"
    root = copy_of(task, tmp_path)
    apply_patch(parse_diff(diff), task, root)
    assert (root / "lib" / "deep" / "new.py").read_text() == "Z = 3\n"


def test_globs() -> None:
    assert glob_regex("lib/**/*.py").match("lib/a.py")
    assert glob_regex("lib/**/*.py").match("lib/x/y/a.py")
    assert not glob_regex("*.py").match("lib/a.py")
    assert not glob_regex("kernel.py").match("kernel.pyc")


def test_load_patch_limits_and_formats(task: Task, tmp_path: Path) -> None:
    big = tmp_path / "big.diff"
    big.write_text(GOOD + "#" * 2000)
    with pytest.raises(PatchError, match="exceeds the limit of 1000 bytes"):
        load_patch(big, max_bytes=1000)
    binary = tmp_path / "bin.diff"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(PatchError, match="binary"):
        load_patch(binary)
    with pytest.raises(PatchError, match="not found"):
        load_patch(tmp_path / "missing.diff")
    knobs = tmp_path / "k.toml"
    knobs.write_text('author = "search"\nrationale = "bigger"\n[knobs]\nsize = 16\nmode = "b"\n')
    patch = load_patch(knobs)
    assert patch.kind == "knobs" and patch.author == "search"
    assert apply_patch(patch, task, copy_of(task, tmp_path)) == {"size": 16, "mode": "b"}


@pytest.mark.parametrize(
    ("knobs", "reason"),
    [
        ({"nope": 1}, "unknown knob 'nope'"),
        ({"size": 100}, "above the maximum"),
        ({"mode": "c"}, "not one of"),
        ({"size": 2.5}, "expected an integer"),
    ],  # fmt: skip
)
def test_bad_knob_values(task: Task, tmp_path: Path, knobs: dict, reason: str) -> None:
    with pytest.raises(UserError, match=reason):
        apply_patch(knob_patch(knobs), task, tmp_path)


@pytest.mark.parametrize(
    ("diff", "why"),
    [
        (GOOD + "+    return x + 3\n", "header's line counts end before it"),  # git skips it
        (GOOD.replace("@@ -1,2 +1,2 @@", "@@ -1,3 +1,2 @@"), "fewer lines than its header"),
        (
            "--- a/kernel.py\n+++ b/kernel.py\n@@ -1,2 +1,1 @@\n def f(x):\n"
            "+    return x + 2\n-    return x + 1\n",
            "more added lines",
        ),
    ],
)
def test_hunk_whose_body_disagrees_with_its_counts_is_refused(diff: str, why: str) -> None:
    # `git apply` follows the counts, so what it applies would not be what a reviewer reads.
    with pytest.raises(PatchError, match=why):
        parse_diff(diff)


def test_hunk_counts_accept_no_newline_markers_and_a_signature() -> None:
    no_newline = GOOD.replace(
        "+    return x + 2\n", "+    return x + 2\n\\ No newline at end of file\n"
    )
    parse_diff(no_newline)
    parse_diff(GOOD + "-- \n2.39.2\n\n")


def test_line_endings_are_part_of_a_diffs_hash() -> None:
    # A CRLF copy applies differently (git keeps the carriage returns), so it is another patch.
    assert parse_diff(GOOD).hash != parse_diff(GOOD.replace("\n", "\r\n")).hash
