"""The canonical ATIF-shaped trajectory built from a real SQLite run store."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from trajectory_store import BAD_ARGS, ENV_SECRET, GITHUB, SECRETS, Fixture

from infra_agent.store import open_store
from infra_agent.store.records import StepRecord
from infra_agent.store.verdict import Verdict
from infra_agent.trajectories.atif import Trajectory
from infra_agent.trajectories.build import build_trajectory, load_run
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ExportFormat


def _trajectory(fx: Fixture, run_id: str) -> tuple[Trajectory, list[StepRecord]]:
    store = open_store(fx.db, readonly=True)
    run = store.get_run(run_id)
    assert run is not None
    bundle = load_run(store, run)
    return build_trajectory(bundle), bundle.steps


def test_steps_follow_atif_and_fold_tool_results_into_observations(fx: Fixture) -> None:
    t, records = _trajectory(fx, fx.run_a)
    assert t.schema_version == "ATIF-v1.4" and t.session_id == fx.run_a
    assert [s.step_id for s in t.steps] == list(range(1, len(t.steps) + 1))
    sources = [s.source for s in t.steps]
    assert sources == ["system", "user", "agent", "agent", "system", "agent", "agent"]
    assert (t.steps[4].extra.role, t.steps[4].extra.name) == ("harness", "decision")
    # Every store message is in exactly one step, in order.
    seqs = [q for s in t.steps for q in s.extra.seqs]
    assert sorted(seqs) == [r.seq for r in records] and len(records) == fx.a_messages
    n_results = sum(len(s.observation.results) for s in t.steps if s.observation)
    assert len(t.steps) + n_results == t.final_metrics.extra.store_messages == fx.a_messages
    parallel = t.steps[5]
    assert [c.tool_call_id for c in parallel.tool_calls or []] == ["call_3", "call_4"]
    assert parallel.observation is not None
    assert [r.source_call_id for r in parallel.observation.results] == ["call_3", "call_4"]


def test_tool_calls_keep_arguments_and_invalid_json_is_preserved_raw(fx: Fixture) -> None:
    t, _ = _trajectory(fx, fx.run_a)
    first = t.steps[2]
    assert first.tool_calls and first.tool_calls[0].arguments == {"target": "decode", "seconds": 5}
    bad = t.steps[3]
    assert bad.tool_calls and bad.tool_calls[0].arguments == {}  # ATIF requires an object
    assert [(r.tool_call_id, r.raw) for r in bad.extra.raw_tool_arguments] == [("call_2", BAD_ARGS)]
    assert bad.extra.tool_errors[0].source_call_id == "call_2"
    assert t.final_metrics.extra.tool_calls == fx.a_tool_calls


def test_metrics_tokens_cost_and_logprobs(fx: Fixture) -> None:
    t, _ = _trajectory(fx, fx.run_a)
    m = t.steps[2].metrics
    assert m is not None
    assert (m.prompt_tokens, m.completion_tokens, m.cost_usd) == (900, 60, 0.0012)
    assert m.logprobs == [-0.1, -0.02] and m.completion_token_ids == [5, 9]
    assert m.extra["tokens"] == ["Let", " me"]
    fm = t.final_metrics
    assert fm.total_prompt_tokens == 900 + 1000 + 1300 + 1500
    assert fm.total_cost_usd == pytest.approx(0.0052)


def test_patches_verdicts_review_and_outcome(fx: Fixture) -> None:
    t, _ = _trajectory(fx, fx.run_a)
    assert t.verdicts() == fx.a_verdicts
    out = t.final_metrics.extra
    # The suspicious 40x win is not the best speedup; the approved, clean 1.62x one is.
    assert out.best_speedup == 1.62 and (out.best_speedup_ci_low, out.best_speedup_ci_high) == (
        1.55,
        1.70,
    )
    assert out.best_patch_id == "a" * 64
    assert out.accuracy_outcome == "passed"
    assert (
        out.verdict_counts.IMPROVED == 2
        and out.verdict_counts.REJECTED == 1
        and out.verdict_counts.INCORRECT == 1
    )
    assert out.suspicious == 1 and out.reviewed is True
    proposals = {p.patch_id[0]: p for p in t.extra.proposals}
    assert proposals["a"].reward.components.review == 1.0
    assert proposals["a"].decisions[0].reviewer == "alice"
    assert (
        proposals["d"].reward.components.review == -1.0
        and proposals["d"].reward.components.suspicious == -1.0
    )
    reward = t.extra.reward
    assert reward.total == out.reward
    assert reward.components.proven_improvement == pytest.approx(math.log2(1.55))
    assert reward.components.rule_violation == -1.0  # the run tried to edit the harness
    incorrect = next(
        e for p in t.extra.patches for e in p.experiments if e.verdict is Verdict.INCORRECT
    )
    assert incorrect.evidence.extra["divergence_layer"] == 3
    assert json.loads(t.extra.patches[2].knobs_json) == {"batch_size": 16, "dtype": "bf16"}


def test_task_and_environment_fingerprint(fx: Fixture) -> None:
    t, _ = _trajectory(fx, fx.run_a)
    task = t.extra.task
    assert (task.id, task.objective) == ("decode-split-norm", "latency")
    assert task.prompt == "Make decode faster without changing outputs."
    assert task.seeds == [7] and task.sandboxes == ["local"]
    assert "netns:bwrap" in task.isolation and task.target_fingerprints == ["fp-decode-split-norm"]
    env = task.environment
    assert env.recorded and env.python and env.hardware.cpu_count and "pydantic" in env.packages
    assert env.sandbox is not None and env.sandbox.backend == "local"
    # A run that recorded no environment says so instead of borrowing the exporter's.
    b, _ = _trajectory(fx, fx.run_b)
    assert b.extra.task.environment.recorded is False and b.extra.task.environment.packages == {}


def test_the_record_holds_no_secret_but_the_patches_the_export_redacts(
    fx: Fixture, tmp_path: Path
) -> None:
    """The store redacted everything before writing it, except patches (their id is the hash of
    their content): a secret in a patch's rationale reaches the record, and no export."""
    t, _ = _trajectory(fx, fx.run_a)
    text = t.model_dump_json()
    assert [s for s in SECRETS if s in text] == [GITHUB] and ENV_SECRET not in text
    assert GITHUB in t.extra.patches[1].rationale
    out = tmp_path / "atif.jsonl"
    export_dataset(open_store(fx.db, readonly=True), ExportFormat.ATIF, out)
    assert [s for s in SECRETS if s in out.read_text()] == []


def test_run_without_conversation_still_has_a_trajectory(fx: Fixture) -> None:
    t, _ = _trajectory(fx, fx.run_c)
    assert t.steps == [] and t.final_metrics.total_steps == 0
    assert t.verdicts() == [Verdict.FAILED]
    assert t.extra.reward.components.failure == -1.0
    assert t.final_metrics.extra.accuracy_outcome == "not_measured"
