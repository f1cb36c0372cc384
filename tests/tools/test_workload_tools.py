"""The experiment's own workload, published: describe_task shows it, microbench and
accuracy_diff run on it when the model gives no inputs (decode-split-norm)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from infra_agent.cli import app
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry
from infra_agent.tools.workload import task_workload

CACHE = [4, 8, 2048, 64]
"""decode-split-norm's KV cache shape at its default parameters (task.toml [params])."""


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    task = find_task("decode-split-norm")
    return ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="run-test")


def _shapes(workload: dict) -> dict[str, list[int]]:
    return {i["name"]: i["shape"] for i in workload["inputs"]}


def test_decode_split_norm_publishes_its_measured_shapes_and_describe_task_shows_them(
    ctx: ToolContext,
) -> None:
    workload = task_workload(ctx)
    assert workload.ready and "decode_server.decode(q, num_splits=4" in workload.call
    assert _shapes(workload.model_dump()) == {"k": CACHE, "v": CACHE, "q": [4, 4, 8, 64]}
    assert "seq_len=2048" not in workload.setup and "2048" in workload.setup  # shapes filled in
    ctx.params = {"seq_len": 512}  # the run's overrides change what is published
    assert task_workload(ctx).inputs[0].shape == [4, 8, 512, 64]
    shown = default_registry().call("describe_task", "{}", ctx).content
    assert "workload: 4 decode steps of batch 4 x 8 heads over a 512-token KV cache" in shown
    assert "k float32[4, 8, 512, 64]" in shown and "seeds:" in shown


def test_the_published_shapes_are_the_harness_own_inputs(ctx: ToolContext) -> None:
    """The workload says what the harness really feeds: its own input builders' shapes."""
    import sys

    from infra_agent.experiments.arms import load_harness

    harness = load_harness(ctx.task, dict(ctx.task.manifest.params))
    module = sys.modules[type(harness).__module__]
    k, v = module.make_cache(harness.params, 1)
    q = module.make_queries(harness.params, 1)
    published = _shapes(
        harness.workload({"num_splits": 4, "block_size": 128, "threads": 1}).model_dump()
    )
    assert published == {"k": list(k.shape), "v": list(v.shape), "q": list(q.shape)}


@pytest.mark.slow
def test_microbench_with_no_inputs_runs_the_bench_engine_on_the_experiments_workload(
    ctx: ToolContext, tmp_path: Path
) -> None:
    ctx.params = {"seq_len": 256}  # the published workload at a smaller scale: a quick test
    result = default_registry().call("microbench", json.dumps({"seconds": 1.0}), ctx)
    assert result.error is None and result.data is not None, result.error
    data = result.data
    assert _shapes(data["arms"]["workload"]) == {
        "k": [4, 8, 256, 64], "v": [4, 8, 256, 64], "q": [4, 4, 8, 64],
    }  # fmt: skip
    assert data["arms"]["baseline"] == data["arms"]["candidate"]
    assert data["arms"]["baseline"].startswith("decode_server.decode(q, num_splits=4")
    # The real engine ran: warm-up calls on both arms, a calibration, interleaved samples.
    assert len(data["warmup_calls"]) == 2 and min(data["warmup_calls"]) >= 1
    assert data["calibration_steps"] and data["iterations_per_sample"] >= 1
    assert data["timer"] == "sandbox:perf_counter_ns" and data["rounds"] >= 3
    assert "warm-up calls" in result.content and "experiment's workload" in result.content
    # The same record keys as `infra-agent feedback bench --json`, plus what ran and the task's
    # minimum effect (a bench of two files has no task).
    code = tmp_path / "k.py"
    code.write_text("def f():\n    sum(range(100))\n")
    cli = CliRunner().invoke(
        app, ["feedback", "bench", f"{code}:f", f"{code}:f", "--budget-s", "0.5", "--json"]
    )
    assert cli.exit_code == 0, cli.output
    assert set(data) - {"arms", "min_effect"} == set(json.loads(cli.stdout))
    assert data["min_effect"] == ctx.task.manifest.min_effect


@pytest.mark.slow
def test_accuracy_diff_with_no_inputs_compares_on_the_workload_and_applies_the_task_rule(
    ctx: ToolContext,
) -> None:
    ctx.params = {"seq_len": 256}
    reg = default_registry()
    same = reg.call("accuracy_diff", "{}", ctx)
    assert same.error is None and same.data is not None, same.error
    assert _shapes(same.data["arms"]["workload"])["k"] == [4, 8, 256, 64]
    assert same.data["probes"][0]["diff"]["shape"] == [4, 4, 8, 64]  # the measured output
    assert same.data["would_pass"] is True and same.content.startswith("accuracy_diff on the")
    rule = same.data["rule"]
    assert (rule["atol"], rule["rtol"], rule["f64_factor"]) == (1e-5, 1e-4, 2.0)
    assert "would pass the experiment's accuracy rule" in same.content
    # The probes' own tolerance is told apart from the rule (a relay run read 'would pass'
    # beside 'FAIL 822/16384 outside tolerance' as two contradicting verdicts).
    assert "\nelementwise check (the tolerance below, not the rule above): " in same.content
    # A candidate 1% off (relative RMS) fails the task's rule, and says so with the number.
    noisy = (
        "(lambda o: o + 1e-2 * o.pow(2).mean().sqrt() * torch.randn(o.shape, "
        "generator=torch.Generator().manual_seed(5)))(decode_server.decode(q))"
    )
    off = reg.call("accuracy_diff", json.dumps({"candidate": noisy}), ctx)
    assert off.error is None and off.data is not None, off.error
    assert off.data["would_pass"] is False
    assert "would fail the experiment's accuracy rule" in off.content
    rel = off.data["probes"][0]["diff"]["rel_rms"]
    assert 0.0095 < rel < 0.0105 and f"rel RMS {rel:.2e}" in off.content
    assert off.data["probes"][0]["candidate_vs_f64"]["rel_rms"] == pytest.approx(rel, rel=0.05)
    assert len(off.content) < 2000


@pytest.mark.slow
def test_a_patch_id_alone_benchmarks_and_diffs_the_patched_workload_against_the_baseline(
    ctx: ToolContext,
) -> None:
    """The reference fix (one pass per split, log-sum-exp merge) on the published workload:
    the candidate arm runs in the patched copy, the baseline in the unpatched one."""
    ctx.params = {"seq_len": 1024}
    reg = default_registry()
    diff = (ctx.task.root / "reference.patch").read_text()
    proposed = reg.call("propose_patch", json.dumps({"diff": diff, "rationale": "fix"}), ctx)
    assert proposed.data is not None, proposed.error
    patch_id = proposed.data["patch_id"]
    asked = {"patch_id": patch_id, "seconds": 2.0, "clock": "cpu"}
    bench = reg.call("microbench", json.dumps(asked), ctx)
    assert bench.data is not None, bench.error
    assert bench.data["arms"]["patch_id"] == patch_id
    assert bench.data["timer"] == "sandbox:thread_time_ns"
    # Both arms timed and compared; how much faster the fix runs is a measurement
    # (benchmarks/bench_verdict_margins.py split-norm-reference: 2.4-3.0x), not this tool's.
    c = bench.data["comparison"]
    assert c["ci_low"] <= c["speedup"] <= c["ci_high"] and c["n_baseline"] >= 3
    accuracy = reg.call("accuracy_diff", json.dumps({"patch_id": patch_id}), ctx)
    assert accuracy.data is not None, accuracy.error
    assert accuracy.data["would_pass"] is True and f"patch {patch_id[:12]}" in accuracy.content


READY = {
    "batch-invariant-moe": {},
    "chunked-state-precision": {},
    "example-matmul": {},
    "kv-transfer-gil": {},
    "pd-kv-reuse-race": {"requests": 200},
    "tiered-cache-load-order": {"requests": 200},
}
"""Python tasks besides decode-split-norm that publish a ready setup (with quicker params)."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(READY))
def test_every_published_setup_runs_on_its_workspace(name: str, tmp_path: Path) -> None:
    """The published setup and call run against the task's real workspace (A/A microbench), and
    where a float64 reference is published, the baseline passes its own task's rule."""
    ctx = ToolContext(task=find_task(name), store=open_store(tmp_path / "r.db"), run_id="r")
    ctx.params = dict(READY[name])
    workload = task_workload(ctx)
    assert workload.ready and workload.inputs and workload.seeds
    reg = default_registry()
    bench = reg.call("microbench", json.dumps({"seconds": 0.5}), ctx)
    assert bench.error is None and bench.data is not None, bench.error
    assert bench.data["arms"]["baseline"] == workload.call
    if workload.reference:
        same = reg.call("accuracy_diff", "{}", ctx)
        assert same.error is None and same.data is not None, same.error
        assert same.data["would_pass"] is True, same.content
        assert all(p["candidate_vs_f64"] is not None for p in same.data["probes"])


def test_a_serving_task_describes_its_load_and_the_tools_ask_for_inputs(tmp_path: Path) -> None:
    ctx = ToolContext(
        task=find_task("sglang-cpu-tiny"), store=open_store(tmp_path / "r.db"), run_id="r"
    )
    shown = default_registry().call("describe_task", "{}", ctx).content
    assert "workload: 32 requests of 64 random tokens -> 32 tokens via /generate" in shown
    assert "seeds: fresh prompts from an unseen seed for every sample" in shown
    refused = default_registry().call("microbench", "{}", ctx)
    assert refused.error is not None and "publishes no ready setup" in refused.error
    assert "\n" not in refused.error


@pytest.mark.slow
def test_would_fail_agrees_with_run_experiment_on_a_candidate_one_percent_off(
    ctx: ToolContext,
) -> None:
    """A patch adding 1% relative RMS noise to the attention output: accuracy_diff on the
    published workload says it would fail the task's rule, and the experiment finds it
    INCORRECT."""
    import difflib

    from infra_agent.experiments import run_experiment
    from infra_agent.store.verdict import Verdict

    ctx.params = {"seq_len": 256}
    old = (ctx.task.workspace / "attention.py").read_text()
    new = old.replace(
        "            out += torch.matmul(probs.unsqueeze(-2), v[:, :, page:stop]).squeeze(-2)\n"
        "    return out\n",
        "            out += torch.matmul(probs.unsqueeze(-2), v[:, :, page:stop]).squeeze(-2)\n"
        "    return out + 1e-2 * out.pow(2).mean().sqrt() * torch.randn_like(out)\n",
    )
    assert new != old
    diff = "".join(
        difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), "a/attention.py", "b/attention.py"
        )
    )
    reg = default_registry()
    proposed = reg.call("propose_patch", json.dumps({"diff": diff, "rationale": "noise"}), ctx)
    assert proposed.data is not None, proposed.error
    patch_id = proposed.data["patch_id"]
    judged = reg.call("accuracy_diff", json.dumps({"patch_id": patch_id}), ctx)
    assert judged.data is not None, judged.error
    assert judged.data["would_pass"] is False and "would fail" in judged.content
    assert 0.008 < judged.data["probes"][0]["diff"]["rel_rms"] < 0.012
    record = run_experiment(ctx.task, ctx.patch(patch_id), params=ctx.params)
    assert record.result.verdict == Verdict.INCORRECT, record.result.reasons


def test_what_the_model_leaves_out_comes_from_the_workload_with_the_patch_knobs(
    ctx: ToolContext, tmp_path: Path
) -> None:
    from infra_agent.tools.sandboxed import resolve_arms as _arms

    reg = default_registry()
    knobs = reg.call(
        "propose_knobs", json.dumps({"knobs": {"num_splits": 2}, "rationale": "fewer"}), ctx
    )
    assert knobs.data is not None, knobs.error
    arms, patch = _arms(ctx, None, None, None, knobs.data["patch_id"], want_reference=True)
    assert patch is not None and arms.workload is not None
    assert arms.baseline.startswith("decode_server.decode(q, num_splits=4,")
    assert arms.candidate.startswith("decode_server.decode(q, num_splits=2,")  # the patch's arm
    assert arms.reference == "reference_f64(q, k, v)" and "decode_server.load_cache" in arms.setup
    mine, _ = _arms(ctx, None, "decode_server.decode(q)", None, None)
    assert mine.candidate == "decode_server.decode(q)" and mine.reference is None
    serving = ToolContext(
        task=find_task("sglang-cpu-tiny"), store=open_store(tmp_path / "s.db"), run_id="s"
    )
    own, _ = _arms(serving, "x = 1", "x + 1", None, None)  # nothing needed from the workload
    assert own.candidate == "x + 1" and own.workload is None


class _Sent(Exception):
    """Raised by the stand-in server once it has recorded what a serving tool sent it."""


def test_serving_tools_send_the_tasks_workload_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sglang-slow-decode sends prompts of up to 256 random tokens: so do serving_workload and
    server_steps when the model gives no shape (they used to default to 64); a shape given
    overrides it. The server is a stand-in that records the sessions and the load it was sent
    (no SGLang), kept by the first look and reused by the others (one start)."""
    from infra_agent.tools import looks

    sent: list[tuple[Any, Any]] = []
    starts: list[Any] = []
    (tmp_path / "server.log").write_text("")

    class StandIn:
        log_path = tmp_path / "server.log"

        def call(self, fn: Any, sessions: Any, load: Any) -> Any:
            sent.append((sessions, load))
            raise _Sent

        def cpu_seconds(self) -> float:
            return 0.0

        def info(self) -> dict[str, Any]:
            return {}

    class Kept:
        start_s = 1.0
        started_as: list[str] = []

        def running(self) -> Any:
            return _Context(StandIn())

        def alive(self) -> bool:
            return True

        def close(self) -> None:
            return None

    def start(ctx: Any, patch: Any, knobs: Any) -> Any:
        starts.append(patch)
        return Kept()

    monkeypatch.setattr(looks, "start_look_server", start)
    ctx = ToolContext(
        task=find_task("sglang-slow-decode"), store=open_store(tmp_path / "r.db"), run_id="r"
    )
    reg = default_registry()
    for name in ("serving_workload", "server_steps"):
        assert "_Sent" in (reg.call(name, "{}", ctx).error or "")
    shaped = {"input_len": 64, "output_len": 8, "num_prompts": 4, "max_concurrency": 2}
    assert "_Sent" in (reg.call("serving_workload", json.dumps(shaped), ctx).error or "")
    (default, load), (steps, _), (given, given_load) = sent
    prompts = [len(s.turns[0].new_ids) for s in default]
    assert len(default) == 32 and 200 < max(prompts) <= 256 and min(prompts) >= 128  # the task's
    assert 16 < max(s.turns[0].output_len for s in default) <= 32
    assert load.max_concurrency is None and load.request_rate == float("inf")
    assert [len(s.turns[0].new_ids) for s in steps] == prompts  # server_steps: the same
    assert len(given) == 4 and max(len(s.turns[0].new_ids) for s in given) <= 64
    assert max(s.turns[0].output_len for s in given) <= 8 and given_load.max_concurrency == 2
    schema = reg.get("serving_workload").schema()["function"]["parameters"]["properties"]  # type: ignore[union-attr]
    assert "the task's workload" in schema["input_len"]["description"]
    assert starts == [None] and ctx.looks_used == 3  # the baseline's server, started once


class _Context:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __enter__(self) -> Any:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None
