"""Every export loads with Hugging Face `datasets` offline and keeps its counts, calls and rewards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trajectory_store import Fixture

from infra_agent.store import open_store
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import ExportFormat, trajectory_from_parquet_row


@pytest.mark.slow
def test_all_formats_load_with_datasets_offline(
    fx: Fixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    store = open_store(fx.db, readonly=True)
    atif_jsonl = tmp_path / "atif.jsonl"
    export_dataset(store, ExportFormat.ATIF, atif_jsonl)
    reference = {
        json.loads(line)["session_id"]: json.loads(line)
        for line in atif_jsonl.read_text().splitlines()
    }
    ref_a = reference[fx.run_a]
    for fmt in ExportFormat:
        for parquet in (False, True):
            path = tmp_path / f"{fmt.value}.{'parquet' if parquet else 'jsonl'}"
            export_dataset(store, fmt, path, parquet=parquet)
            ds = datasets.load_dataset(
                "parquet" if parquet else "json", data_files=str(path), split="train",
                cache_dir=str(tmp_path / "hf-cache"),
            )  # fmt: skip
            rows = ds.to_list()
            where = f"{fmt.value} parquet={parquet}"
            if fmt is ExportFormat.ATIF:
                assert len(rows) == 3, where
                if parquet:
                    t = trajectory_from_parquet_row(
                        next(r for r in rows if r["session_id"] == fx.run_a)
                    )
                    got = t.model_dump(mode="json")
                else:
                    got = next(r for r in rows if r["session_id"] == fx.run_a)
                assert len(got["steps"]) == len(ref_a["steps"]), where
                calls = [
                    c["tool_call_id"] for s in got["steps"] for c in (s.get("tool_calls") or [])
                ]
                assert calls == ["call_1", "call_2", "call_3", "call_4"], where
                assert got["final_metrics"]["extra"]["reward"] == pytest.approx(
                    ref_a["final_metrics"]["extra"]["reward"], rel=1e-9
                ), where
                verdicts = [e["verdict"] for p in got["extra"]["patches"] for e in p["experiments"]]
                assert verdicts == [v.value for v in fx.a_verdicts], where
                continue
            assert len(rows) == 2, where
            if fmt is ExportFormat.OPENAI_SFT:
                row = next(r for r in rows if r["metadata"]["session_id"] == fx.run_a)
                messages, reward, verdicts = (
                    row["messages"],
                    row["metadata"]["reward"],
                    row["metadata"]["verdicts"],
                )
            else:
                row = next(r for r in rows if r["session_id"] == fx.run_a)
                messages, reward, verdicts = (
                    row["prompt"] + row["completion"],
                    row["reward"],
                    row["verdicts"],
                )
                # `datasets` parses JSON floats to ~10 significant digits; Parquet is exact.
                assert row["reward_components"] == pytest.approx(
                    ref_a["extra"]["reward"]["components"], rel=1e-9
                ), where
            assert len(messages) == fx.a_visible, where
            calls = [c for m in messages for c in (m.get("tool_calls") or [])]
            assert [c["id"] for c in calls] == ["call_1", "call_2", "call_3", "call_4"], where
            assert all(isinstance(c["function"]["arguments"], str) for c in calls), where
            assert reward == pytest.approx(ref_a["final_metrics"]["extra"]["reward"], rel=1e-9), (
                where
            )
            assert verdicts == [v.value for v in fx.a_verdicts], where
