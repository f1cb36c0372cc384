"""A realistic run store for the export tests (imported by conftest.py and the tests), built with the store API in a real SQLite file.

Run A (llm policy) has a system prompt, a user task, an agent turn with reasoning and a tool
call, a tool call whose arguments are not valid JSON (with the tool's error reply), a note of
the agent loop (harness, never shown to the model), a turn
with two parallel calls, per-step tokens/cost/logprobs, and four experiments: IMPROVED with a
confidence interval, REJECTED (rule violation), INCORRECT, and a suspicious IMPROVED. Two
proposals: the clean win approved by a reviewer, the suspicious one rejected.
Run B (scripted policy, another task, a day later): one NO_CHANGE experiment, no review.
Run C (search policy): no conversation, one FAILED experiment.

Secrets are planted in model messages, tool arguments and outputs, errors, experiment log
tails, patch rationale and decision comments; `SECRETS` lists every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from infra_agent.sandboxes.host import capture_environment
from infra_agent.store import RunStore, open_store
from infra_agent.store.records import (
    DecisionAction,
    DecisionRecord,
    ExperimentRecord,
    PatchKind,
    PatchRecord,
    ProposalRecord,
    ProposalStatus,
    RunRecord,
    RunStatus,
    StepRecord,
    ToolCall,
)
from infra_agent.store.verdict import (
    CorrectnessEvidence,
    Evidence,
    ExperimentResult,
    Flag,
    PerformanceEvidence,
    SandboxEvidence,
    Verdict,
)

SECRET_ENV = "MYSVC_API_TOKEN"
ENV_SECRET = "zq8-plain-looking-value-4471"  # matches no shape: only the env-var rule catches it
OPENAI_KEY = "sk-proj-4f9Qm2LxZr7TbN1vW8yKc3Hd"
BEARER = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib3QiLCJpYXQiOjE3MDB9.c2lnbmF0dXJlLXBhcnQtaGVyZQ"
GITHUB = "ghp_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
HF = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm12345678"
ARG_SECRET = "pw-for-db-93jf8s"
SECRETS = [ENV_SECRET, OPENAI_KEY, BEARER, GITHUB, HF, ARG_SECRET]

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
BAD_ARGS = '{"knobs": {"batch_size": 16'  # truncated: the model ran out of tokens


@dataclass
class Fixture:
    db: Path
    run_a: str
    run_b: str
    run_c: str
    a_messages: int
    """Store messages of run A."""
    a_visible: int
    """Of which the model saw (all but the harness note)."""
    a_tool_calls: int
    a_verdicts: list[Verdict]


def _perf(speedup: float, lo: float, hi: float) -> PerformanceEvidence:
    return PerformanceEvidence(
        metric="step_time_ms", unit="ms", higher_is_better=False,
        baseline_median=10.0, candidate_median=10.0 / speedup, speedup=speedup,
        ci_low=lo, ci_high=hi, n_samples=20,
        baseline_samples=[10.0, 10.1, 9.9], candidate_samples=[10.0 / speedup] * 3,
        noise=[], method="interleaved bootstrap of median ratio",
    )  # fmt: skip


def _sandbox() -> SandboxEvidence:
    return SandboxEvidence(backend="local", isolation=["netns:bwrap", "rlimit:as", "env:scrubbed"])


def _experiment(store: RunStore, run_id: str | None, task: str, patch: PatchRecord, result: ExperimentResult, at: datetime) -> ExperimentRecord:  # fmt: skip
    store.put_patch(patch)
    exp = ExperimentRecord(
        run_id=run_id, task=task, patch_id=patch.id, sandbox="local", result=result,
        started_at=at, duration_s=12.5, target_fingerprint="fp-" + task,
    )  # fmt: skip
    store.put_experiment(exp)
    return exp


def _step(store: RunStore, run_id: str, at: datetime, **fields: object) -> StepRecord:
    return store.add_step(StepRecord(run_id=run_id, created_at=at, **fields))  # type: ignore[arg-type]


def build_store(db: Path) -> Fixture:
    store = open_store(db)
    task = "decode-split-norm"
    run_a = RunRecord(
        task=task, objective="latency", policy="llm", model="glm-4.6",
        status=RunStatus.FINISHED, summary="1.6x faster decode kernel, approved",
        config={"seed": 7, "budget_experiments": 10}, environment=capture_environment("local"),
        created_at=T0,
    )  # fmt: skip
    store.put_run(run_a)
    t = iter(T0 + timedelta(seconds=i) for i in range(1000))
    a = run_a.id
    _step(
        store,
        a,
        next(t),
        role="system",
        content="You are an infra engineer. Prove every change by experiment.",
    )
    _step(store, a, next(t), role="user", content="Make decode faster without changing outputs.")
    _step(
        store, a, next(t), role="assistant", content="Let me profile first.",
        reasoning_content=f"The key from the env is {OPENAI_KEY}; never print it.",
        tool_calls=[ToolCall(id="call_1", name="profile", arguments='{"target": "decode", "seconds": 5}')],
        prompt_tokens=900, completion_tokens=60, cost_usd=0.0012,
        logprobs=[{"token": "Let", "logprob": -0.1, "token_id": 5}, {"token": " me", "logprob": -0.02, "token_id": 9}],
    )  # fmt: skip
    _step(store, a, next(t), role="tool", tool_call_id="call_1", name="profile",
          content=f"norm recomputed 4x per split. curl -H 'Authorization: Bearer {BEARER}' ok")  # fmt: skip
    _step(
        store, a, next(t), role="assistant", content="",
        tool_calls=[ToolCall(id="call_2", name="set_knobs", arguments=BAD_ARGS)],
        prompt_tokens=1000, completion_tokens=20, cost_usd=0.001,
    )  # fmt: skip
    _step(store, a, next(t), role="tool", tool_call_id="call_2", name="set_knobs", content="",
          error=f"arguments are not valid JSON (token {ENV_SECRET} rejected)")  # fmt: skip
    # A note of the agent loop: logged, never sent to the model.
    _step(
        store,
        a,
        next(t),
        role="harness",
        name="decision",
        content="decision: continue; 1 experiment left",
    )
    _step(
        store, a, next(t), role="assistant", content="Trying the fused-norm patch and a knob change.",
        tool_calls=[
            ToolCall(id="call_3", name="run_experiment", arguments='{"patch": "fuse_norm.diff"}'),
            ToolCall(id="call_4", name="run_experiment",
                     arguments=f'{{"patch": "knobs.toml", "db_password": "{ARG_SECRET}"}}'),
        ],
        prompt_tokens=1300, completion_tokens=80, cost_usd=0.002,
    )  # fmt: skip
    _step(store, a, next(t), role="tool", tool_call_id="call_3", name="run_experiment",
          content="IMPROVED speedup 1.62x (95% CI 1.55-1.70)")  # fmt: skip
    _step(store, a, next(t), role="tool", tool_call_id="call_4", name="run_experiment",
          content=f"REJECTED: patch touches harness.py; env had OPENAI_API_KEY={OPENAI_KEY}")  # fmt: skip
    _step(store, a, next(t), role="assistant", content="Submitting the fused-norm patch for review.",
          prompt_tokens=1500, completion_tokens=30, cost_usd=0.001)  # fmt: skip

    good = PatchRecord(id="a" * 64, kind=PatchKind.DIFF, diff="--- a/k.py\n+++ b/k.py\n@@\n-x\n+y\n",
                       files=["k.py"], author="glm-4.6", rationale="compute the norm once per split")  # fmt: skip
    cheat = PatchRecord(id="b" * 64, kind=PatchKind.DIFF, diff="--- a/harness.py\n", files=["harness.py"],
                        author="glm-4.6", rationale=f"see {GITHUB}")  # fmt: skip
    wrong = PatchRecord(
        id="c" * 64,
        kind=PatchKind.KNOBS,
        knobs={"batch_size": 16, "dtype": "bf16"},
        author="glm-4.6",
    )
    fast = PatchRecord(
        id="d" * 64, kind=PatchKind.DIFF, diff="--- a/k.py\n", files=["k.py"], author="glm-4.6"
    )
    improved = ExperimentResult(
        task=task, patch_id=good.id, verdict=Verdict.IMPROVED, reasons=["latency 1.62x better, CI excludes 1"],
        evidence=Evidence(
            stage_reached="performance", performance=_perf(1.62, 1.55, 1.70),
            correctness=CorrectnessEvidence(passed=True, checks=8, max_abs_err=1e-7, tolerance="atol=1e-5"),
            health={"nan_outputs": 0}, sandbox=_sandbox(), durations_s={"performance": 9.0},
        ),
    )  # fmt: skip
    rejected = ExperimentResult(
        task=task, patch_id=cheat.id, verdict=Verdict.REJECTED, reasons=["patch touches harness.py"],
        evidence=Evidence(stage_reached="apply", rule_violations=["harness.py is not editable"], sandbox=_sandbox()),
    )  # fmt: skip
    incorrect = ExperimentResult(
        task=task, patch_id=wrong.id, verdict=Verdict.INCORRECT, reasons=["max abs err 0.3 > atol"],
        evidence=Evidence(
            stage_reached="correctness",
            correctness=CorrectnessEvidence(passed=False, checks=3, max_abs_err=0.3, detail="check 2 failed"),
            log_tail=f"Traceback ...\nHTTPError 401 for token {GITHUB}\nAuthorization: Bearer {BEARER}",
            extra={"divergence_layer": 3, "note": "first diverges at layer 3"},
        ),
    )  # fmt: skip
    suspicious = ExperimentResult(
        task=task, patch_id=fast.id, verdict=Verdict.IMPROVED, flags=[Flag.SUSPICIOUS],
        reasons=["speedup 40x above plausibility bound 5x"],
        evidence=Evidence(stage_reached="performance", performance=_perf(40.0, 35.0, 45.0),
                          correctness=CorrectnessEvidence(passed=True, checks=8)),
    )  # fmt: skip
    e_good = _experiment(store, a, task, good, improved, T0 + timedelta(minutes=1))
    _experiment(store, a, task, cheat, rejected, T0 + timedelta(minutes=2))
    _experiment(store, a, task, wrong, incorrect, T0 + timedelta(minutes=3))
    e_fast = _experiment(store, a, task, fast, suspicious, T0 + timedelta(minutes=4))

    p_good = ProposalRecord(run_id=a, task=task, patch_id=good.id, patch_hash=good.id, experiment_ids=[e_good.id],
                            status=ProposalStatus.APPROVED, expected_gain=1.62, rationale="norm once per split",
                            created_at=T0 + timedelta(minutes=5))  # fmt: skip
    p_fast = ProposalRecord(run_id=a, task=task, patch_id=fast.id, patch_hash=fast.id, experiment_ids=[e_fast.id],
                            status=ProposalStatus.REJECTED, expected_gain=40.0, created_at=T0 + timedelta(minutes=6))  # fmt: skip
    store.put_proposal(p_good)
    store.put_proposal(p_fast)
    store.add_decision(DecisionRecord(proposal_id=p_good.id, reviewer="alice", action=DecisionAction.APPROVE,
                                      patch_hash=good.id, comment="LGTM", created_at=T0 + timedelta(minutes=7)))  # fmt: skip
    store.add_decision(DecisionRecord(proposal_id=p_fast.id, reviewer="bob", action=DecisionAction.REJECT,
                                      patch_hash=fast.id, comment=f"timer patched? my token {HF}",
                                      created_at=T0 + timedelta(minutes=8)))  # fmt: skip

    run_b = RunRecord(task="sglang-cpu-tiny", objective="throughput", policy="scripted", model="scripted",
                      status=RunStatus.FINISHED, created_at=T0 + timedelta(days=1))  # fmt: skip
    store.put_run(run_b)
    b = run_b.id
    t = iter(T0 + timedelta(days=1, seconds=i) for i in range(100))
    _step(store, b, next(t), role="user", content="Raise throughput.")
    _step(store, b, next(t), role="assistant", content="",
          tool_calls=[ToolCall(id="b1", name="run_experiment", arguments='{"knobs": {"chunked_prefill_size": 512}}')])  # fmt: skip
    _step(
        store,
        b,
        next(t),
        role="tool",
        tool_call_id="b1",
        name="run_experiment",
        content="NO_CHANGE",
    )
    no_change = ExperimentResult(
        task="sglang-cpu-tiny", patch_id="e" * 64, verdict=Verdict.NO_CHANGE, reasons=["within noise"],
        evidence=Evidence(stage_reached="performance", performance=_perf(1.01, 0.98, 1.04),
                          health={"spec_accept_length_min": 2.1, "guard": "ok"}),
    )  # fmt: skip
    knob = PatchRecord(
        id="e" * 64, kind=PatchKind.KNOBS, knobs={"chunked_prefill_size": 512}, author="scripted"
    )
    _experiment(store, b, "sglang-cpu-tiny", knob, no_change, T0 + timedelta(days=1, minutes=1))

    run_c = RunRecord(
        task=task, objective="latency", policy="search", created_at=T0 + timedelta(days=2)
    )
    store.put_run(run_c)
    failed = ExperimentResult(task=task, patch_id="f" * 64, verdict=Verdict.FAILED, reasons=["timeout after 60 s"],
                              evidence=Evidence(stage_reached="correctness", log_tail="killed"))  # fmt: skip
    _experiment(store, run_c.id, task, PatchRecord(id="f" * 64, kind=PatchKind.KNOBS, knobs={"x": True}), failed,
                T0 + timedelta(days=2, minutes=1))  # fmt: skip
    store.close()
    return Fixture(
        db=db, run_a=a, run_b=b, run_c=run_c.id, a_messages=11, a_visible=10, a_tool_calls=4,
        a_verdicts=[Verdict.IMPROVED, Verdict.REJECTED, Verdict.INCORRECT, Verdict.IMPROVED],
    )  # fmt: skip
