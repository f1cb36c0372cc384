"""Every export loads with Hugging Face `datasets` offline, keeps its counts, calls and rewards,
and its JSONL and Parquet files load to the same columns and values."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from trajectory_store import Fixture

from infra_agent.store import open_store
from infra_agent.trajectories.export import export_dataset
from infra_agent.trajectories.formats import FORMATS, ExportFormat


def _close(a: Any, b: Any) -> bool:
    """Equal as `datasets` reads the two files: it reads a JSONL file holding objects of varying
    shape through pandas, which keeps about 10 significant digits of a float (Parquet keeps
    all), and turns ISO date-time text in JSONL into (UTC) datetimes."""
    if isinstance(a, datetime) and isinstance(b, str):
        return a.replace(tzinfo=UTC) == datetime.fromisoformat(b)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


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
        loaded = {}
        for parquet in (False, True):
            path = tmp_path / f"{fmt.value}.{'parquet' if parquet else 'jsonl'}"
            export_dataset(store, fmt, path, parquet=parquet)
            ds = datasets.load_dataset(
                "parquet" if parquet else "json", data_files=str(path), split="train",
                cache_dir=str(tmp_path / "hf-cache"),
            )  # fmt: skip
            rows = loaded[parquet] = ds.to_list()
            assert ds.column_names == [f.name for f in FORMATS[fmt].schema]
            where = f"{fmt.value} parquet={parquet}"
            if fmt is ExportFormat.ATIF:
                assert len(rows) == 3, where
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
                assert got["extra"]["task"]["environment"]["recorded"] is True, where
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
            assert row["tools"] and all("function" in spec for spec in row["tools"]), where
        # The two files load to the same columns and values.
        assert _close(loaded[False], loaded[True]), fmt
