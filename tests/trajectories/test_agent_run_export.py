"""A real agent run (scripted policy: test equipment) through review, exported in every format.

The run uses the real graph, tools, sandbox and verification cascade on a quick copy of the
bundled decode-split-norm task; a reviewer approves the proposal and the run resumes and applies
it. Every export must then round-trip the store's step count, tool calls, verdicts and rewards,
load with `datasets` offline, and carry no planted secret.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recorded_samples import replay_timing
from support import quick_decode_task

from infra_agent.redact import Redactor
from infra_agent.store import open_store
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ExportFormat

PLANTED = "sk-proj-Zx81mQ0pLr4TbN1vW8yKc3Hd"  # a key the model "leaks" in its reasoning


def _script(diff: str) -> list[dict[str, object]]:
    return [
        {"reasoning_content": f"Read the task first. (env key {PLANTED})", "content": "Reading the task.",
         "tool_calls": [{"name": "describe_task", "arguments": {}}]},
        {"content": "A malformed call.", "tool_calls": [{"name": "propose_patch", "arguments": '{"diff": '}]},
        {"reasoning_content": "Per-split statistics, merged once.",
         "tool_calls": [{"name": "propose_patch", "arguments": {"diff": diff, "rationale": "normalize once"}}]},
        {"tool_calls": [{"name": "run_experiment", "arguments": {"patch_id": "{{last_patch_id}}"}}]},
        {"content": "Proven.", "tool_calls": [{"name": "finish", "arguments": {"summary": "IMPROVED"}}]},
    ]  # fmt: skip


@pytest.mark.slow
def test_real_scripted_run_exports_in_every_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra_agent.agent.configuration import RunConfig
    from infra_agent.agent.runner import resume_after_review, start_run
    from infra_agent.agent.state import Budget
    from infra_agent.config import load_settings
    from infra_agent.review.queue import decide

    task = quick_decode_task(tmp_path)
    replay_timing(task, "quick-reference")  # IMPROVED (2.3x recorded) whatever the load
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script((task / "reference.patch").read_text())))
    db = tmp_path / "runs.db"
    settings = load_settings(overrides={"store.db": str(db)})
    config = RunConfig(
        task=str(task), policy="scripted", script=str(script), budget=Budget(experiments=2, turns=8)
    )
    outcome = start_run(config, settings)
    assert outcome.status == "waiting_review", outcome
    [proposal] = outcome.proposals
    store = open_store(db)
    decide(
        store,
        proposal.id,
        reviewer="ana",
        action="approve",
        patch_hash=proposal.patch_id,
        comment="ok",
    )
    store.close()
    resume_after_review(db, outcome.run_id, settings)

    store = open_store(db, readonly=True)
    steps = store.steps(outcome.run_id)
    raw_calls = [c for s in steps for c in s.tool_calls]
    seen = [s for s in steps if s.role != "harness"]  # the loop's notes never reach the model
    assert len(seen) < len(steps)
    verdicts = [e.result.verdict.value for e in store.experiments(outcome.run_id)]
    assert verdicts == ["IMPROVED"]
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    redactor = Redactor.from_environment(extra=[PLANTED])
    reward = None
    for fmt in ExportFormat:
        for parquet in (False, True):
            where = f"{fmt.value} parquet={parquet}"
            out = tmp_path / "export" / f"{fmt.value}.{'parquet' if parquet else 'jsonl'}"
            summary = export_dataset(store, fmt, out, parquet=parquet, redactor=redactor)
            assert summary.rows == 1
            assert PLANTED.encode() not in out.read_bytes()
            ds = datasets.load_dataset("parquet" if parquet else "json", data_files=str(out), split="train",
                                       cache_dir=str(tmp_path / "hf-cache"))  # fmt: skip
            [row] = ds.to_list()
            if fmt is ExportFormat.ATIF:
                data = row
                # The run recorded where it ran when it started; the export shows it.
                env = data["extra"]["task"]["environment"]
                assert env["recorded"] is True and env["python"] and env["packages"]["pydantic"]
                assert env["hardware"]["cpu_count"] and env["sandbox"]["backend"] == "local"
                n = len(data["steps"]) + sum(
                    len((s.get("observation") or {}).get("results", [])) for s in data["steps"]
                )
                calls = [
                    c["tool_call_id"] for s in data["steps"] for c in (s.get("tool_calls") or [])
                ]
                got_verdicts = [
                    e["verdict"] for p in data["extra"]["patches"] for e in p["experiments"]
                ]
                got_reward = data["final_metrics"]["extra"]["reward"]
                assert data["extra"]["proposals"][0]["status"] == "applied"
                assert data["final_metrics"]["extra"]["reviewed"] is True
            else:
                messages = (
                    row["messages"]
                    if fmt is ExportFormat.OPENAI_SFT
                    else row["prompt"] + row["completion"]
                )
                meta = row["metadata"] if fmt is ExportFormat.OPENAI_SFT else row
                n = len(messages) + len(steps) - len(seen)
                calls = [c["id"] for m in messages for c in (m.get("tool_calls") or [])]
                got_verdicts, got_reward = meta["verdicts"], meta["reward"]
                names = {spec["function"]["name"] for spec in row["tools"]}
                assert {"describe_task", "propose_patch", "run_experiment", "finish"} <= names, (
                    where
                )
            assert n == len(steps), where
            assert calls == [c.id for c in raw_calls], where
            assert got_verdicts == verdicts, where
            reward = got_reward if reward is None else reward
            assert got_reward == pytest.approx(reward, rel=1e-9), where
    assert reward is not None and reward > 0  # a proven, approved improvement
