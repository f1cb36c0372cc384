"""The real SGLang server on the CPU (tiny generated model): start, workloads, accuracy gate,
health guard, stress; a broken flag; and an experiment through the verification cascade: a
knob change (CIs from >= 3 repetitions per arm), whose candidate server stops with nothing left
when the experiment ends. In the long tier, a
degenerate source patch to SGLang's sampler (loops, less work) that must not be IMPROVED.

Needs the SGLang environment (`python -m infra_agent.serving.env --ensure`, run by `make setup`).
Server starts dominate the time (20-60 s each on an idle 2-core machine): the tests that read a
server and the knob experiment's baseline arm use one kept server, the unpatched engine with the
task's knobs (tests/serving/conftest.py's `tiny_baseline`, shared with
test_judge_adversarial.py); besides it, one failed start and the knob experiment's candidate.
"""

import os
from pathlib import Path

import pytest
from support import sglang_server_marks

from infra_agent.errors import UserError
from infra_agent.sandboxes import fileview, netns
from infra_agent.sandboxes.proctree import alive as _alive
from infra_agent.sandboxes.proctree import descendants
from infra_agent.serving.deployment import load_deployment
from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.harness.accuracy import compare_likelihood, score_tokens
from infra_agent.serving.knobs import check_flags
from infra_agent.serving.load.datasets import coding_agent_sessions, random_sessions
from infra_agent.serving.load.generator import LoadSpec, run_workload
from infra_agent.serving.load.metrics import summarize
from infra_agent.serving.load.stress import StressSpec, run_stress
from infra_agent.serving.server import Server, ServerFailed
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import knob_patch, load_patch
from infra_agent.tasks.registry import find_task

pytestmark = sglang_server_marks()
TASK = find_task("sglang-cpu-tiny")
SMALL = {
    "num_prompts": 48,
    "output_len": 16,
}
"""Test-sized workload: the ranking of arms needs repetitions, not long runs."""


def _short(max_samples: int) -> Task:
    """The task with a performance stage of `max_samples` per arm (two rounds of interleaved
    pairs for 4), for tests whose assertions do not need the interval resolved: the task's own
    budget samples until its measure_budget_s (the knob test took 208 s with 150 s of it, 122 s
    with 4 samples, at load <= 2)."""
    manifest = TASK.manifest.model_copy(deep=True)
    manifest.budget = manifest.budget.model_copy(
        update={"min_samples": max_samples, "max_samples": max_samples}
    )
    return TASK.model_copy(update={"manifest": manifest})


def test_workloads_on_the_real_server(tiny_server: Server) -> None:
    """About 60 s (66 s at load 6-8) with the kept server's start, which the next tests reuse."""
    server = tiny_server
    if netns.unavailable() is None:  # patched SGLang code would run without a network
        assert server.network.mode == "isolated", server.network.render()
    result = server.call(
        run_workload, random_sessions(24, 48, 12, vocab_size=1024, seed=3), LoadSpec(seed=3)
    )
    metrics = summarize(result)
    print(metrics.render())
    assert metrics.completed == 24 and metrics.output_throughput > 0
    for rec in result.records:
        assert rec.ttft_s is not None and rec.ttft_s <= rec.latency_s
        assert rec.output_tokens == len(rec.output_ids or []) == rec.meta["completion_tokens"]
        # One chunk per decode step; SGLang merges steps a slow reader has not taken yet.
        assert 1 <= len(rec.itl_s) <= rec.output_tokens - 1
    # OpenAI API, and the multi-turn coding-agent shape reusing the shared prefix.
    # Through the relay: a caller that only has a URL (here the OpenAI API) reaches it too.
    openai = run_workload(
        server.url, random_sessions(4, 32, 8, vocab_size=1024, seed=4), LoadSpec(api="completions")
    )
    # ... counted from the token ids its stream carried (return_token_ids), as the server claims.
    for r in openai.records:
        assert r.success and len(r.output_ids or []) == r.output_tokens == r.claimed_tokens
    agent = server.call(
        run_workload,
        coding_agent_sessions(
            3,
            vocab_size=1024,
            shared_prefix_len=256,
            context_len=64,
            turns=2,
            user_len=16,
            output_len=8,
        ),
        LoadSpec(max_concurrency=2),
    )
    assert len(agent.records) == 6 and all(r.success for r in agent.records)
    second_turns = [r for r in agent.records if r.turn == 1]
    assert all(r.meta["cached_tokens"] >= 256 for r in second_turns)  # prefix cache reused


def test_gate_health_and_stress_on_the_real_server(tiny_server: Server) -> None:
    server = tiny_server
    # The same prompts answered twice (sampled: no two runs agree token for token), every output
    # scored under the server: the likelihood judge sees one distribution.
    sessions = random_sessions(24, 32, 16, vocab_size=1024, seed=5)
    runs = [server.call(run_workload, sessions, LoadSpec(seed=5)) for _ in range(2)]
    means = []
    for run in runs:
        ordered = sorted(run.records, key=lambda r: r.session)
        scores = server.call(
            score_tokens, [(r.prompt_ids or [], r.output_ids or []) for r in ordered]
        )
        means.append([sum(s) / len(s) for s in scores])
    gate = compare_likelihood(means[0], means[1])
    assert gate.passed and gate.pairs == 24 and -7.0 < gate.baseline_nats < -5.0, gate.render()
    run = server.call(
        run_workload, random_sessions(8, 32, 96, range_ratio=0, vocab_size=1024, seed=6), LoadSpec()
    )
    report = ServingHarness.score(run.records)
    assert report.outputs == 8 and report.unhealthy == 0, report.render()
    stress = server.call(run_stress, StressSpec(repeats=12, probe_concurrency=3, background_concurrency=2,
                                                background_input_len=64, background_output_len=16, output_len=12))  # fmt: skip
    print(stress.render())
    assert stress.completed == 12 and stress.background_requests > 0


def test_broken_flag_fails_with_the_log_tail(tmp_path: Path) -> None:
    spec = load_deployment(TASK.root / "deployment.toml")
    with pytest.raises(UserError, match="not one of"):
        check_flags({"schedule-policy": "no-such-policy"})  # refused before any start
    with pytest.raises(ServerFailed) as err:
        Server.start(spec, tmp_path, knobs={"schedule-policy": "no-such-policy"})
    assert "invalid choice" in err.value.log_tail


@pytest.mark.usefixtures("lent_baseline")
def test_knob_experiment_has_cis_from_repetitions(monkeypatch: pytest.MonkeyPatch) -> None:
    """A knob experiment through the cascade: CIs from repetitions, the calibration statement and
    the resolution in the verdict, output tokens per CPU-second beside throughput, and the other
    arm's server stopped (no CPU used) through every sample, and nothing of the candidate's server
    left once it ends. Over 60 s (127 s at load 6-8 with two starts): the candidate's server start
    and 4 samples per arm, the only knob experiment on real servers here (its baseline arm is the
    kept server)."""
    from infra_agent.experiments import run_experiment

    idle: list[tuple[bool, float]] = []  # (the idle server stopped, its CPU seconds used)
    trees: list[tuple[Server, set[int], int | None]] = []  # the candidate's server, its processes
    sample = ServingHarness.sample

    def watched(self: ServingHarness, arm, seed: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
        other = next(a for name, a in self.arms.items() if name != arm.name).state["server"]
        server = arm.state["server"]
        if arm.name == "candidate" and not trees and server.proc is not None:
            trees.append((server, descendants(server.proc.pid) | {server.proc.pid}, server.namespace_id))  # fmt: skip
        cpu = other.cpu_seconds()
        out = sample(self, arm, seed)
        idle.append((other.stopped(), other.cpu_seconds() - cpu))
        return out

    monkeypatch.setattr(ServingHarness, "sample", watched)
    patch = load_patch(TASK.root / "knobs.toml")
    record = run_experiment(_short(4), patch, params=SMALL)
    result = record.result
    print(result.render())
    assert result.verdict in (Verdict.IMPROVED, Verdict.NO_CHANGE, Verdict.REGRESSED), (
        result.reasons
    )
    perf = result.evidence.performance
    assert perf is not None and perf.n_samples >= 3
    assert len(perf.baseline_samples) >= 3 and len(perf.candidate_samples) >= 3
    assert perf.ci_low <= perf.speedup <= perf.ci_high
    assert result.evidence.correctness is not None and result.evidence.correctness.passed
    # Stated before measuring, and in the verdict: the noise and what the budget can detect.
    assert perf.calibration.startswith("calibration: per-pair noise") and perf.pair_noise
    assert perf.detectable_effect is not None and perf.detectable_effect > 1.0
    said = ("resolution: this measurement detects", "underpowered: NO_CHANGE only rules out")
    assert sum(r.startswith(said) for r in result.reasons) == 1, result.reasons  # said once
    assert result.evidence.metrics["output_tokens_per_cpu_s_speedup"] > 0
    # The evidence states the confinement each server really had (not the arm sandbox's).
    if fileview.unavailable() is None and os.geteuid() == 0:
        for arm in ("baseline", "candidate"):
            confined = str(result.evidence.health[f"{arm}_server_confinement"])
            assert confined.startswith("bwrap (") and "pidns:bwrap" in confined, confined
            assert "cgroup:freezer" in confined and "user:0" not in confined, confined
    assert any("output_tokens_per_cpu_s" in r for r in result.reasons)
    # The idle arm's server was stopped and took no CPU while the other arm was measured: a few
    # clock ticks (10 ms each) read across the stop (more than two seen at load 5: the stop reaches a
    # busy process late); running, the idle server polls ~0.8 cores, over a second per sample.
    assert len(idle) == 2 * perf.n_samples, idle
    assert all(stopped and cpu <= 0.1 for stopped, cpu in idle), idle
    # The candidate's server stopped with the experiment and left nothing running.
    ((server, tree, ns),) = trees
    assert len(tree) >= 3  # launcher, scheduler, detokenizer
    assert not any(_alive(p) for p in tree)
    if server.network.mode == "isolated":
        assert netns.users(ns) == [], netns.own_threads_in(ns)  # nothing left in it
    # The candidate's SGLang ran with no network (where this machine allows it).
    if netns.unavailable() is None:
        assert str(result.evidence.health["candidate_server_network"]).startswith("isolated")
    # ... and saw only what it needed of the file system (where bubblewrap works).
    if fileview.unavailable() is None:
        assert str(result.evidence.health["candidate_server_filesystem"]).startswith("confined")


@pytest.mark.long
def test_degenerate_sampler_patch_is_not_improved() -> None:
    """Long tier (95-169 s in suite runs at load 2-11: two server starts): a source patch to
    SGLang's sampler, judged INCORRECT at the check by the likelihood judge, not by the speed.
    Covered in the main tier by test_judge_adversarial.py's flat-logits cheat (a sampler patch
    whose tokens are not the model's, INCORRECT with "likelihood FAIL") on the kept baseline."""
    from infra_agent.experiments import run_experiment

    # The degenerate sampler's tokens (a 4-token cycle) are judged by the check, which runs the
    # measured workload's own sampled requests: far less likely than the model's samples.
    patch = load_patch(TASK.root / "degenerate.patch")
    record = run_experiment(_short(4), patch, params=SMALL)
    result = record.result
    print(result.render())
    assert result.verdict is not Verdict.IMPROVED
    assert result.verdict is Verdict.INCORRECT
    assert result.evidence.stage_reached == "correctness"
    assert any("likelihood FAIL" in reason for reason in result.reasons), result.reasons


def test_knob_patch_for_a_gpu_only_flag_is_refused_on_cpu() -> None:
    from infra_agent.experiments import run_experiment

    # A patch the task refuses is an experiment too: REJECTED at the apply stage, with its reason.
    record = run_experiment(TASK, knob_patch({"enable-hierarchical-cache": True}), params=SMALL)
    assert record.result.verdict is Verdict.REJECTED, record.result.render()
    assert record.result.evidence.stage_reached == "apply"
    assert any("unknown knob" in r for r in record.result.reasons), record.result.reasons
