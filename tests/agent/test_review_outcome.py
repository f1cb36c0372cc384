"""What a review decision does to the run waiting for it, as the help text says: a rejection (or a
change request beyond the run's revisions) ends the run with the decision and comment in its run
log; `runs list` shows each run's proposals as pending, approved or rejected. The experiment is
a stand-in (an IMPROVED record): what is tested is the loop around it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import run_cli

from infra_agent.agent import runner
from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.runner import resume_run, start_run
from infra_agent.agent.state import Budget
from infra_agent.config import load_settings
from infra_agent.review.queue import decide
from infra_agent.store import open_store
from infra_agent.store.records import ExperimentRecord
from infra_agent.store.verdict import Evidence, ExperimentResult, PerformanceEvidence, Verdict
from infra_agent.tasks.registry import find_task


def improved(task: Any, patch: Any, *, store: Any, run_id: str, **kw: Any) -> ExperimentRecord:
    perf = PerformanceEvidence(
        metric="step_time_ms", unit="ms", higher_is_better=False, baseline_median=10.0,
        candidate_median=5.0, speedup=2.0, ci_low=1.9, ci_high=2.1, n_samples=8, min_effect=0.03,
    )  # fmt: skip
    result = ExperimentResult(task=task.name, patch_id=patch.hash, verdict=Verdict.IMPROVED,
                              reasons=["better with confidence"],
                              evidence=Evidence(stage_reached="performance", performance=perf))  # fmt: skip
    record = ExperimentRecord(run_id=run_id, task=task.name, patch_id=patch.hash, result=result)
    store.put_experiment(record)
    return record


def _hoist_script(tmp_path: Path) -> Path:
    """A scripted model's replies: propose decode-split-norm's reference fix, measure it, finish."""
    diff = (find_task("decode-split-norm").root / "reference.patch").read_text()
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"tool_calls": [{"name": "propose_patch", "arguments": {"diff": diff, "rationale": "hoist"}}]},
        {"tool_calls": [{"name": "run_experiment", "arguments": {"patch_id": "{{last_patch_id}}"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": "hoisted; 2x"}}]},
    ]))  # fmt: skip
    return script


@pytest.mark.parametrize(
    ("action", "revisions"),
    [("reject", 1), ("request_changes", 0)],
    ids=["reject", "changes beyond revisions"],  # fmt: skip
)
def test_a_decision_that_ends_the_run_is_logged_and_listed(
    action: str, revisions: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runner, "run_experiment", improved)
    script = _hoist_script(tmp_path)
    db = tmp_path / "runs.db"
    settings = load_settings(overrides={"store.db": str(db)})
    config = RunConfig(task="decode-split-norm", policy="scripted", script=str(script),
                       budget=Budget(experiments=3), max_revisions=revisions)  # fmt: skip
    outcome = start_run(config, settings)
    assert outcome.status == "waiting_review", outcome
    [proposal] = outcome.proposals
    listed = json.loads(run_cli("--db", str(db), "runs", "list", "--json").stdout)
    assert listed[0]["review"] == {proposal.id: "pending"}

    store = open_store(db)
    decide(store, proposal.id, reviewer="ana", action=action, patch_hash=proposal.patch_id,
           comment="it changes the kernel's numerics")  # fmt: skip
    store.close()
    done = resume_run(outcome.run_id, settings, review_only=True)

    assert done.status == "finished" and not done.applied
    store = open_store(db)
    steps = store.steps(outcome.run_id)
    store.close()
    status = "rejected" if action == "reject" else "changes_requested"
    logged = [s.content for s in steps if s.name == "review"]
    assert logged == [f"review: proposal {proposal.id} is {status} by ana: it changes the kernel's numerics"  # fmt: skip
                      + ("; not sent back: the run has used its 0 revision(s)" if revisions == 0 else "")]  # fmt: skip
    assert sum(s.role == "assistant" for s in steps) == 3  # the model got no further turn
    listed = json.loads(run_cli("--db", str(db), "runs", "list", "--json").stdout)
    assert listed[0]["review"] == {proposal.id: status}
    human = run_cli("--db", str(db), "runs", "list", env={"COLUMNS": "200"}).stdout
    assert status in human


def test_the_configured_review_policy_judges_the_runs_proposal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[review] policy` reaches the queue from the run's settings (the runner passes it down):
    a policy forbidding the patched file rejects the run's proposal at once."""
    monkeypatch.setattr(runner, "run_experiment", improved)
    script = _hoist_script(tmp_path)
    policy = tmp_path / "strict.toml"
    policy.write_text('[[rule]]\nfiles = ["**"]\naction = "forbid"\nreason = "frozen code"\n')
    settings = load_settings(
        overrides={"store.db": str(tmp_path / "runs.db"), "review.policy": str(policy)}
    )
    config = RunConfig(task="decode-split-norm", policy="scripted", script=str(script),
                       budget=Budget(experiments=3))  # fmt: skip
    outcome = start_run(config, settings)
    [proposal] = outcome.proposals
    assert outcome.status != "waiting_review", outcome
    store = open_store(tmp_path / "runs.db")
    stored = store.get_proposal(proposal.id)
    store.close()
    assert stored is not None and stored.status.value == "rejected", stored
    assert stored.risk.value == "forbidden"
