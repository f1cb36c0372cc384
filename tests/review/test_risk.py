"""Risk policy: levels from what a patch touches, flags, and TOML rules (first match wins)."""

from __future__ import annotations

import pytest

from infra_agent.errors import UserError
from infra_agent.review.queue import submit_proposal
from infra_agent.review.risk import PolicyAction, assess, glob_match, load_policy
from infra_agent.store.records import PatchKind, PatchRecord, ProposalStatus, RiskLevel
from infra_agent.store.verdict import Flag, Verdict


def _patch(files=(), knobs=None) -> PatchRecord:
    kind = PatchKind.KNOBS if knobs else PatchKind.DIFF
    return PatchRecord(id="h" * 64, kind=kind, files=list(files), knobs=knobs or {})


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("**/kernels/**", "kernels/a.py", True),
        ("**/kernels/**", "srt/layers/kernels/x/a.py", True),
        ("*.py", "a/b.py", False),
        ("**/*sched*", "managers/scheduler.py", True),
        ("**", "anything/at/all.txt", True),
        ("harness.py", "sub/harness.py", False),
    ],
)
def test_glob(pattern: str, path: str, hit: bool) -> None:
    assert glob_match(pattern, path) is hit


def test_levels_by_what_is_touched(kit) -> None:
    result = kit.measured_result("t", "h" * 64)
    knobs = assess(_patch(knobs={"max_batch": 32}), result)
    sched = assess(_patch(files=["srt/managers/scheduler.py"]), result)
    kernel = assess(
        _patch(files=["srt/mem_cache/allocator.py", "srt/managers/scheduler.py"]), result
    )
    harness = assess(_patch(files=["harness.py"]), result)
    assert (knobs.level, knobs.action) == (RiskLevel.LOW, PolicyAction.AUTO_APPROVE)
    assert (sched.level, sched.action) == (RiskLevel.MEDIUM, PolicyAction.REVIEW)
    assert (kernel.level, kernel.action) == (RiskLevel.HIGH, PolicyAction.REVIEW)
    assert (harness.level, harness.action) == (RiskLevel.FORBIDDEN, PolicyAction.FORBID)


def test_a_win_noise_could_explain_goes_to_a_person_whatever_the_policy(kit) -> None:
    """`make optimize` under load once auto-applied `IMPROVED (noisy) 1.556x [1.177, 2.441]`,
    which measured NO_CHANGE on a quiet machine. A policy that does not block `noisy` (or any
    flag) still cannot auto-approve a noisy win, nor one whose interval's low end lies within
    twice the task's minimum effect of 1."""
    knobs = _patch(knobs={"max_batch": 32})
    permissive = load_policy()
    permissive.blocking_flags = []
    noisy = kit.measured_result("t", "h" * 64, speedup=1.556, flags=[Flag.NOISY])
    gate = assess(knobs, noisy, permissive)
    assert gate.action == PolicyAction.REVIEW and "noise could explain" in gate.reasons[-1]
    close = kit.measured_result("t", "h" * 64, speedup=1.08)  # 95% CI 1.03-1.13
    assert close.evidence.performance is not None
    close.evidence.performance.min_effect = 0.02
    gate = assess(knobs, close, permissive)
    assert gate.action == PolicyAction.REVIEW and "below 1.040" in gate.reasons[-1], gate.reasons
    close.evidence.performance.min_effect = 0.01  # 1.03 clears 1 + 2 x 1%
    assert assess(knobs, close, permissive).action == PolicyAction.AUTO_APPROVE
    clear = kit.measured_result("t", "h" * 64, speedup=1.3)
    assert assess(knobs, clear, permissive).action == PolicyAction.AUTO_APPROVE


def test_flags_and_verdict_block_auto_approval(kit) -> None:
    near = assess(
        _patch(knobs={"max_batch": 32}),
        kit.measured_result("t", "h" * 64, flags=[Flag.ACCURACY_NEAR_THRESHOLD]),
    )
    assert (near.level, near.action) == (RiskLevel.MEDIUM, PolicyAction.REVIEW)
    result = kit.measured_result("t", "h" * 64)
    result.verdict = Verdict.NO_CHANGE
    flat = assess(_patch(knobs={"max_batch": 32}), result)
    assert flat.action == PolicyAction.REVIEW
    assert any("NO_CHANGE" in r for r in flat.reasons)


def test_policy_file_first_match_wins(tmp_path, kit) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(
        '[[rule]]\nknobs = ["max_*"]\naction = "review"\nrisk = "medium"\nreason = "memory sizing"\n'
        '[[rule]]\nknobs = ["*"]\naction = "auto-approve"\nrisk = "low"\n'
    )
    policy = load_policy(path)
    result = kit.measured_result("t", "h" * 64)
    assert assess(_patch(knobs={"max_batch": 32}), result, policy).action == PolicyAction.REVIEW
    assert (
        assess(_patch(knobs={"stream_interval": 2}), result, policy).action
        == PolicyAction.AUTO_APPROVE
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[rule]]\naction = 'review'\n", "neither 'files' nor 'knobs'"),
        ("[[rule]]\nfiles=['*']\naction = 'maybe'\n", "rule.0.action"),
        ("rule = [", "not valid TOML"),
    ],
)
def test_malformed_policy_is_one_line_error(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=message):
        load_policy(path)


def test_auto_approval_and_forbid_are_audited_as_policy(store, task, kit) -> None:
    knobs = kit.knob_patch_record({"max_batch": 32})
    auto = submit_proposal(
        store,
        task=task,
        patch=knobs,
        experiment=kit.experiment_for(task, knobs),
        rationale="",
        run_id=None,
    )
    assert auto.status == ProposalStatus.APPROVED
    [decision] = store.decisions(auto.id)
    assert decision.reviewer == "policy" and decision.action.value == "auto_approve"
    bad = _patch(files=["harness.py"]).model_copy(update={"id": "f" * 64, "diff": "x"})
    forbid = submit_proposal(
        store,
        task=task,
        patch=bad,
        experiment=kit.experiment_for(task, bad),
        rationale="",
        run_id=None,
    )
    assert (forbid.status, forbid.risk) == (ProposalStatus.REJECTED, RiskLevel.FORBIDDEN)


def test_the_policy_given_applies_and_none_is_read_from_the_configuration(
    store, task, kit, tmp_path, monkeypatch
) -> None:
    """The caller passes the configured policy (the agent's runner from its settings: see
    tests/agent/test_review_outcome.py); the queue itself reads no configuration file."""
    policy = tmp_path / "strict.toml"
    policy.write_text(
        '[[rule]]\nknobs = ["max_batch"]\naction = "forbid"\nreason = "memory sizing"\n'
    )
    (tmp_path / "infra-agent.toml").write_text(f'[review]\npolicy = "{policy}"\n')
    monkeypatch.chdir(tmp_path)  # where a configuration file would be found by default
    knobs = kit.knob_patch_record({"max_batch": 32})
    experiment = kit.experiment_for(task, knobs)
    given = submit_proposal(
        store, task=task, patch=knobs, experiment=experiment, rationale="", run_id=None,
        policy=policy,
    )  # fmt: skip
    assert (given.status, given.risk) == (ProposalStatus.REJECTED, RiskLevel.FORBIDDEN)
    assert "memory sizing" in store.decisions(given.id)[0].comment
    other = kit.knob_patch_record({"max_batch": 64})
    default = submit_proposal(
        store, task=task, patch=other, experiment=kit.experiment_for(task, other), rationale="",
        run_id=None,
    )  # fmt: skip
    assert default.risk is not RiskLevel.FORBIDDEN


def test_accuracy_gain_without_performance_stage(kit) -> None:
    from infra_agent.review.queue import expected_gain

    result = kit.measured_result("t", "h" * 64)
    assert expected_gain(result) == pytest.approx(1.3)
    result.evidence.performance = None
    result.evidence.correctness.baseline_err_f64 = 4e-6
    result.evidence.correctness.candidate_err_f64 = 1e-6
    assert expected_gain(result) == pytest.approx(4.0)


def test_a_patch_adding_a_secret_like_literal_is_high_risk_and_stored_as_is(
    store, task, kit
) -> None:
    secret = "ghs8Kd0qPz91LmXcR2"
    diff = kit.SCHED_DIFF.replace(
        "+    # Slicing avoids a Python-level loop per request.\n",
        f'+    # Slicing avoids a Python-level loop per request.\n+    TOKEN = "{secret}"\n',
    ).replace("@@ -2,9 +2,5 @@", "@@ -2,9 +2,6 @@")
    patch = kit.diff_patch(diff)
    proposal = submit_proposal(
        store, task=task, patch=patch, experiment=kit.experiment_for(task, patch),
        rationale="", run_id=None,
    )  # fmt: skip
    assert proposal.risk == RiskLevel.HIGH
    [reason] = [r for r in proposal.risk_reasons if "secret-like literal" in r]
    assert 'scheduler.py:6: TOKEN = "[REDACTED]"' in reason and secret not in reason
    assert secret in store.get_patch(patch.id).diff  # byte-exact: its hash is its identity
    plain = kit.diff_patch()
    assert not any("secret" in r for r in assess(plain, kit.measured_result("t", plain.id)).reasons)


def test_the_incident_win_is_queued_for_a_person_not_applied(store, task, kit, tmp_path) -> None:
    """The path that applied `schedule-conservativeness=0.5` to the deployment: the agent's
    submission of `IMPROVED (noisy) 1.556x [1.177, 2.441]` under a policy that blocks no flag
    (and auto-approves every knob) is pending with the reason, and no decision is recorded."""
    policy = tmp_path / "permissive.toml"
    policy.write_text(
        'blocking_flags = []\n[[rule]]\nknobs = ["*"]\naction = "auto-approve"\nrisk = "low"\n'
    )
    knobs = kit.knob_patch_record({"max_batch": 32})
    experiment = kit.experiment_for(task, knobs, speedup=1.556, flags=[Flag.NOISY])
    perf = experiment.result.evidence.performance
    perf.ci_low, perf.ci_high = 1.177, 2.441
    queued = submit_proposal(
        store, task=task, patch=knobs, experiment=experiment, rationale="", run_id=None,
        policy=policy,
    )  # fmt: skip
    assert queued.status == ProposalStatus.PENDING, queued.risk_reasons
    assert "noise could explain the win" in queued.risk_reasons[-1]
    assert store.decisions(queued.id) == []
    quiet = kit.experiment_for(task, knobs, speedup=1.556)  # same win, clear of the noise
    approved = submit_proposal(
        store, task=task, patch=knobs, experiment=quiet, rationale="", run_id=None, policy=policy
    )
    assert approved.status == ProposalStatus.APPROVED
