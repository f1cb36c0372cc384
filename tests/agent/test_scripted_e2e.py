"""End to end with the scripted policy (test equipment): the real graph, tools, sandboxed
instruments and experiment on decode-split-norm; the run stops at the review interrupt and is
resumed from a new process by an approval, which applies the patch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from recorded_samples import replay_timing

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.runner import start_run
from infra_agent.agent.state import Budget
from infra_agent.config import load_settings
from infra_agent.store import open_store

SETUP = (
    "import torch\nfrom attention import split_decode_attention\ntorch.manual_seed(0)\n"
    "q = torch.randn(2, 4, 64); k = torch.randn(2, 4, 512, 64); v = torch.randn(2, 4, 512, 64)"
)


def conversation(diff: str) -> list[dict[str, object]]:
    """What a model working this task would say, reply by reply."""
    return [
        {
            "reasoning_content": "First understand the task.",
            "content": "Reading the task.",
            "tool_calls": [{"name": "describe_task", "arguments": {}}],
        },
        {
            "content": "",
            "tool_calls": [{"name": "read_file", "arguments": {"path": "attention.py"}}],
        },
        {
            "reasoning_content": "Every split calls _row_normalizer over the whole sequence.",
            "tool_calls": [
                {
                    "name": "lookup_skeletons",
                    "arguments": {"query": "split loop recomputes normalization"},
                }
            ],
        },
        {
            "content": "Check where the time goes.",
            "tool_calls": [
                {
                    "name": "profile",
                    "arguments": {
                        "setup": SETUP,
                        "code": "split_decode_attention(q, k, v, num_splits=4)",
                        "repeat": 2,
                        "overlaps": [["aten::bmm", "aten::exp"]],
                    },
                }
            ],
        },
        {
            "content": "A malformed call, as models sometimes send.",
            "tool_calls": [{"name": "propose_patch", "arguments": '{"diff": '}],
        },
        {
            "reasoning_content": "Keep per-split statistics and merge once (online softmax).",
            "tool_calls": [
                {
                    "name": "propose_patch",
                    "arguments": {
                        "diff": diff,
                        "rationale": "hoist the normalization: one pass over the keys per split, merged at the end",
                    },
                }
            ],
        },
        {
            "tool_calls": [
                {"name": "run_experiment", "arguments": {"patch_id": "{{last_patch_id}}"}}
            ]
        },
        {
            "content": "Proven.",
            "tool_calls": [
                {
                    "name": "finish",
                    "arguments": {"summary": "per-split softmax statistics merged once; IMPROVED"},
                }
            ],
        },
    ]


@pytest.mark.slow
def test_scripted_run_waits_for_review_and_an_approval_from_another_process_applies_it(
    quick_task: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The run reaches review only with an IMPROVED verdict: the quick task reports a recorded
    # real experiment of this fix (2.3x) in place of its clock, so it does whatever the load;
    # the arms still run and check the patched kernel on every sample.
    replay_timing(quick_task, "quick-reference")
    script = tmp_path / "script.json"
    script.write_text(json.dumps(conversation((quick_task / "reference.patch").read_text())))
    db = tmp_path / "runs.db"
    settings = load_settings(overrides={"store.db": str(db)})
    config = RunConfig(
        task=str(quick_task),
        policy="scripted",
        script=str(script),
        budget=Budget(experiments=2, turns=12),
    )
    outcome = start_run(config, settings)

    assert outcome.status == "waiting_review", outcome
    assert [e.verdict for e in outcome.experiments] == ["IMPROVED"]
    assert (
        outcome.best is not None and outcome.best.ci_low is not None and outcome.best.ci_low > 1.0
    )
    [proposal] = outcome.proposals
    assert proposal.status == "pending"
    store = open_store(db)
    steps = store.steps(outcome.run_id)
    tool_steps = {s.name: s for s in steps if s.role == "tool"}
    assert "top host ops" in tool_steps["profile"].content  # a real timeline from the sandbox
    assert "aten::bmm" in tool_steps["profile"].content
    assert "hoist-invariant-normalization" in tool_steps["lookup_skeletons"].content
    assert any(s.error and "not valid JSON" in s.error for s in steps if s.name == "propose_patch")
    assert "IMPROVED" in tool_steps["run_experiment"].content
    assert any(s.reasoning_content and "online softmax" in s.reasoning_content for s in steps)
    [experiment] = store.experiments(outcome.run_id)
    assert experiment.patch_id == proposal.patch_id
    store.close()

    # A reviewer approves in another process; that process resumes the waiting run.
    code = (
        "import sys\n"
        "from infra_agent.store import open_store\n"
        "from infra_agent.review.queue import decide\n"
        "from infra_agent.agent.runner import resume_after_review\n"
        "from infra_agent.config import load_settings\n"
        "db, run_id, pid, patch = sys.argv[1:]\n"
        "store = open_store(db)\n"
        "decide(store, pid, reviewer='ana', action='approve', patch_hash=patch)\n"
        "store.close()\n"
        "resume_after_review(db, run_id, load_settings())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(db), outcome.run_id, proposal.id, proposal.patch_id],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]

    store = open_store(db)
    run = store.get_run(outcome.run_id)
    assert run is not None and run.status.value == "finished"
    final = store.get_proposal(proposal.id)
    assert final is not None and final.status.value == "applied"
    assert "git branch infra-agent/" in final.applied_to
    actions = [d.action.value for d in store.decisions(proposal.id)]
    assert actions == ["approve", "apply"]
    names = [s.name for s in store.steps(outcome.run_id) if s.role == "harness"]
    assert names[-3:] == ["review", "apply", None] or names[-2:] == ["review", "apply"]
    assert len(store.experiments(outcome.run_id)) == 1  # nothing re-run on resume
    # the branch holds the patched kernel
    repo = final.applied_to.split(" in ", 1)[1]
    shown = subprocess.run(
        ["git", "-C", repo, "show", f"infra-agent/{proposal.id}:attention.py"],
        capture_output=True,
        text=True,
    )
    assert "split_max" in shown.stdout

    # The reviewed, proven patch becomes a skeleton later runs can look up.
    monkeypatch.setattr(
        sys, "argv",
        ["infra-agent", "--db", str(db), "skeletons", "save", proposal.id,
         "--name", "per-split-softmax-merge", "--title", "Merge per-split softmax statistics once"],
    )  # fmt: skip
    from infra_agent.cli import main

    main()  # returns normally on success (a UserError would exit non-zero)
    from infra_agent.tools.skeletons import load_skeletons, search_skeletons

    [learned] = search_skeletons("merge per-split softmax statistics", load_skeletons(), top_k=1)
    assert learned.name == "per-split-softmax-merge" and learned.source == outcome.run_id
    assert "split_max" in learned.example
