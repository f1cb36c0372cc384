"""The model's tools: schemas from signatures, precise errors for every kind of bad call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.base import ToolRegistry, ToolResult, tool
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    task = find_task("decode-split-norm")
    return ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="run-test")


def test_every_tool_has_a_schema_generated_from_its_parameters() -> None:
    schemas = {s["function"]["name"]: s for s in default_registry().schemas()}
    for name in (
        "describe_task",
        "read_file",
        "propose_patch",
        "propose_knobs",
        "run_experiment",
        "finish",
    ):
        assert name in schemas
    params = schemas["read_file"]["function"]["parameters"]
    assert params["required"] == ["path"]
    assert params["properties"]["max_lines"]["maximum"] == 1000
    assert (
        schemas["propose_knobs"]["function"]["parameters"]["properties"]["knobs"]["type"]
        == "object"
    )


def test_unknown_tool_bad_json_and_schema_violations_are_answered_precisely(
    ctx: ToolContext,
) -> None:
    reg = default_registry()
    unknown = reg.call("rm_rf", "{}", ctx)
    assert (
        unknown.error and "unknown tool 'rm_rf'" in unknown.error and "read_file" in unknown.error
    )
    bad_json = reg.call("read_file", '{"path": "attention.py"', ctx)
    assert bad_json.error and "not valid JSON" in bad_json.error and "column" in bad_json.error
    not_object = reg.call("read_file", "[1, 2]", ctx)
    assert not_object.error and "must be a JSON object" in not_object.error
    missing = reg.call("read_file", "{}", ctx)
    assert missing.error and "'path'" in missing.error and "Field required" in missing.error
    wrong_type = reg.call(
        "read_file", json.dumps({"path": "attention.py", "max_lines": "lots"}), ctx
    )
    assert wrong_type.error and "'max_lines'" in wrong_type.error
    assert all(r.content.startswith("error: ") for r in (unknown, bad_json, missing, wrong_type))


def test_a_tool_that_raises_becomes_an_error_result_not_a_crash(ctx: ToolContext) -> None:
    class P(BaseModel):
        x: int

    @tool("boom", "always fails", P)
    def boom(p: P, c: object) -> ToolResult:
        raise RuntimeError(f"instrument exploded on {p.x}")

    result = ToolRegistry([boom]).call("boom", '{"x": 3}', ctx)
    assert result.error and "RuntimeError: instrument exploded on 3" in result.error


@pytest.mark.parametrize("extra", [0, 1, 2500])
def test_a_long_tool_result_is_cut_to_its_head_with_a_note(ctx: ToolContext, extra: int) -> None:
    """The model sees the first MAX_RESULT_CHARS characters and how many more there were."""
    from infra_agent.tools.base import MAX_RESULT_CHARS

    class P(BaseModel):
        n: int

    text = "".join(chr(ord("a") + k % 26) for k in range(MAX_RESULT_CHARS + extra))

    @tool("long", "returns n characters", P)
    def long(p: P, c: object) -> ToolResult:
        return ToolResult(content=text[: p.n])

    result = ToolRegistry([long]).call("long", json.dumps({"n": len(text)}), ctx)
    if extra == 0:
        assert result.content == text  # at the limit: whole
    else:
        assert result.content == text[:MAX_RESULT_CHARS] + f"\n[... {extra} more characters cut]"
    assert result.error is None


def test_workspace_reads_are_confined_to_the_workspace(ctx: ToolContext) -> None:
    reg = default_registry()
    listing = reg.call("list_files", "{}", ctx)
    assert "attention.py  (editable)" in listing.content
    text = reg.call("read_file", json.dumps({"path": "attention.py", "max_lines": 5}), ctx)
    assert text.error is None and "attention.py: lines 1-5" in text.content
    for escape in ("../harness.py", "../reference.patch", "/etc/passwd"):
        result = reg.call("read_file", json.dumps({"path": escape}), ctx)
        assert result.error and "outside the task workspace" in result.error
    hits = reg.call("search_files", json.dumps({"regex": r"def split_decode_attention"}), ctx)
    assert "attention.py:" in hits.content
    bad = reg.call("search_files", json.dumps({"regex": "("}), ctx)
    assert bad.error and "invalid" in bad.error


def test_proposed_patches_are_checked_before_any_experiment(ctx: ToolContext) -> None:
    reg = default_registry()
    ok = reg.call(
        "propose_knobs", json.dumps({"knobs": {"num_splits": 2}, "rationale": "two splits"}), ctx
    )
    assert ok.error is None and ok.data is not None
    patch_id = ok.data["patch_id"]
    assert ctx.store.get_patch(patch_id) is not None and ctx.known_patches == [patch_id]
    assert ctx.patch(patch_id).knobs == {"num_splits": 2}
    unknown = reg.call(
        "propose_knobs", json.dumps({"knobs": {"warp_speed": 9}, "rationale": "x"}), ctx
    )
    assert unknown.error and "unknown knob 'warp_speed'" in unknown.error
    out_of_range = reg.call(
        "propose_knobs", json.dumps({"knobs": {"num_splits": 99}, "rationale": "x"}), ctx
    )
    assert out_of_range.error and "above the maximum" in out_of_range.error
    low = reg.call("propose_knobs", json.dumps({"knobs": {"num_splits": 1}, "rationale": "x"}), ctx)
    assert low.error and "below the minimum" in low.error
    diff = "--- a/harness.py\n+++ b/harness.py\n@@ -1 +1 @@\n-a\n+b\n"
    forbidden = reg.call("propose_patch", json.dumps({"diff": diff, "rationale": "x"}), ctx)
    assert forbidden.error and "not editable" in forbidden.error
    reference = (ctx.task.root / "reference.patch").read_text()
    good = reg.call("propose_patch", json.dumps({"diff": reference, "rationale": "hoist"}), ctx)
    assert (
        good.error is None and "applies cleanly" in good.content and "attention.py" in good.content
    )


def test_skeleton_lookup_finds_the_pattern_for_the_symptom(ctx: ToolContext) -> None:
    result = default_registry().call(
        "lookup_skeletons",
        json.dumps({"query": "split loop recomputes the normalization", "top_k": 1}),
        ctx,
    )
    assert "hoist-invariant-normalization" in result.content
    assert "HOW TO TEST IT APPLIES" in result.content and "EXAMPLE" in result.content
    gil = default_registry().call(
        "lookup_skeletons", json.dumps({"query": "GIL starvation thread"}), ctx
    )
    assert gil.content.split("\n")[1].startswith("## release-gil")


@pytest.mark.slow
def test_instruments_run_the_models_code_in_a_sandbox_and_report_with_statistics(
    ctx: ToolContext,
) -> None:
    setup = (
        "import torch\nfrom attention import split_decode_attention\ntorch.manual_seed(0)\n"
        "q = torch.randn(1, 2, 32); k = torch.randn(1, 2, 256, 32); v = torch.randn(1, 2, 256, 32)"
    )
    reg = default_registry()
    bench = reg.call(
        "microbench",
        json.dumps({"setup": setup, "baseline": "split_decode_attention(q, k, v, num_splits=8)",
                    "candidate": "split_decode_attention(q, k, v, num_splits=1)", "seconds": 0.5}),
        ctx,
    )  # fmt: skip
    assert bench.error is None and bench.data is not None
    assert (
        bench.data["comparison"]["verdict"] in ("FASTER", "SLOWER", "SAME", "AMBIGUOUS")
        and bench.data["comparison"]["n_baseline"] >= 5
    )
    assert "95% CI" in bench.content
    diff = reg.call(
        "accuracy_diff",
        json.dumps({"setup": setup, "baseline": "split_decode_attention(q, k, v)",
                    "candidate": "split_decode_attention(q.half().float(), k, v)",
                    "reference": "split_decode_attention(q.double(), k.double(), v.double())"}),
        ctx,
    )  # fmt: skip
    assert (
        diff.error is None
        and diff.data is not None
        and diff.data["verdict"] in ("FAIL", "PASS", "PRECISION_FLOOR")
    )
    assert diff.data["verdict"] == "FAIL"  # rounding q to half precision is visible against float64
    escape = reg.call(
        "microbench",
        json.dumps({"setup": "import socket", "baseline": "socket.create_connection(('1.1.1.1', 53), 1)", "candidate": "1"}),
        ctx,
    )  # fmt: skip
    assert escape.error and "unreachable" in escape.error  # no network in the sandbox


def test_a_saved_skeleton_is_private_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A learned skeleton's example comes from a run, so it is kept like the run store."""
    import os
    import stat

    from infra_agent.tools.skeletons import load_skeletons, save_skeleton, skeleton_from_proposal

    monkeypatch.setenv("INFRA_AGENT_HOME", str(tmp_path / "home"))
    skeleton = skeleton_from_proposal(
        "merge-once", "Merge once", "--- a/x.py\n+++ b/x.py\n", "merge once", "run-1", 1.5
    )
    folder = tmp_path / "home" / "skeletons"
    old = os.umask(0)
    try:
        path = save_skeleton(skeleton, folder)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert "merge-once" in {s.name for s in load_skeletons()}
