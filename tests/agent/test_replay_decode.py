"""A realistic trajectory replayed on decode-split-norm with the scripted policy (the stand-in for
the paid endpoint): the model starts from the first message alone (no describe_task), reads the
kernel, times it with microbench on the experiment's own workload (no inputs given), makes the
fix with edit_file (one call per place, the edits accumulating into one patch), verifies it with
its one experiment, and writes its summary in the last reply the used-up budget leaves it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recorded_samples import replay_timing

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.runner import start_run
from infra_agent.agent.state import Budget
from infra_agent.config import load_settings
from infra_agent.store import open_store
from infra_agent.tasks.manifest import load_task
from infra_agent.tools.patching import task_description


def edits_of(diff: str) -> list[tuple[str, str]]:
    """The (old, new) text of each hunk of a unified diff, as a model would pass to edit_file."""
    edits: list[tuple[list[str], list[str]]] = []
    for line in diff.splitlines():
        if line.startswith("@@"):
            edits.append(([], []))
        elif edits and line[:1] in (" ", "-", "+") and not line.startswith(("---", "+++")):
            old, new = edits[-1]
            if line[0] != "+":
                old.append(line[1:])
            if line[0] != "-":
                new.append(line[1:])
    return [("\n".join(old), "\n".join(new)) for old, new in edits]


@pytest.mark.slow
def test_a_replayed_trajectory_starts_from_the_first_message_and_ends_with_its_summary(
    quick_task: Path, tmp_path: Path
) -> None:
    replay_timing(quick_task, "quick-reference")  # IMPROVED (2.3x recorded) whatever the load
    diff = (quick_task / "reference.patch").read_text()
    summary = "each split keeps its own max and sum; one log-sum-exp merge at the end"
    script = tmp_path / "script.json"
    script.write_text(json.dumps([
        {"reasoning_content": "The first message shows every split normalizing over the whole "
                              "sequence; confirm where.",
         "tool_calls": [{"name": "read_file", "arguments": {"path": "attention.py", "max_lines": 80}}]},
        {"tool_calls": [{"name": "microbench", "arguments": {}}]},
        *({"tool_calls": [{"name": "edit_file", "arguments": {"path": "attention.py", "old": old, "new": new,
                                                             "rationale": "one pass per split"}}]}
          for old, new in edits_of(diff)),
        {"tool_calls": [{"name": "run_experiment", "arguments": {"patch_id": "{{last_patch_id}}"}}]},
        {"tool_calls": [{"name": "finish", "arguments": {"summary": summary}}]},
    ]))  # fmt: skip
    db = tmp_path / "runs.db"
    config = RunConfig(task=str(quick_task), policy="scripted", script=str(script),
                       budget=Budget(experiments=1, turns=10))  # fmt: skip
    outcome = start_run(config, load_settings(overrides={"store.db": str(db)}))

    store = open_store(db)
    steps = store.steps(outcome.run_id)
    proposals = store.proposals(run_id=outcome.run_id)
    store.close()
    first = next(s.content for s in steps if s.role == "user")
    assert task_description(load_task(quick_task).manifest) in first
    assert "Workspace files:\nattention.py  (editable)\ndecode_server.py  (editable)" in first
    assert "def split_decode_attention" in first  # the kernel inline
    verdict = next(s.content for s in steps if s.name == "run_experiment")
    assert "task criteria:\n- target speedup >= 1.5x: " in verdict and "experiments 1/1" in verdict
    bench = next(s for s in steps if s.name == "microbench")
    assert not bench.error and "workload" in bench.content, bench.content  # the published one
    edits = [s for s in steps if s.name == "edit_file"]
    assert len(edits) == len(edits_of(diff)) == 2 and not any(s.error for s in edits)
    assert [e.verdict.value for e in outcome.experiments] == ["IMPROVED"], verdict
    assert outcome.stop_reason == "the scripted policy called finish"
    assert [p.rationale for p in proposals] == [summary]  # the summary written after the result
