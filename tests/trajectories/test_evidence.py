"""The experiments and proposals read as arrays from the store's export columns
(`evidence.EvidenceColumns.of_store`) equal those read off the run bundles (`of_bundles`), value for
value; a batch out of the common shape gives None (the exporter then builds the bundles), and
the Parquet exports stay byte for byte the row path's, filters and tool specs included."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from random_store import random_rewards_store

from infra_agent.experiments.verdict import Verdict
from infra_agent.store import open_store
from infra_agent.store.records import RunRecord, StepRecord, ToolCall
from infra_agent.trajectories.evidence import EvidenceColumns, ReviewColumns
from infra_agent.trajectories.export import ExportFilter, export_dataset
from infra_agent.trajectories.formats import ExportFormat
from infra_agent.trajectories.rewards import RewardWeights
from infra_agent.trajectories.rows import run_row
from infra_agent.trajectories.trusted import TrustedReview, load_trusted_runs
from infra_agent.trajectories.writers import ParquetSink, arrow_table

CHAT = (ExportFormat.OPENAI_SFT, ExportFormat.RL)
DEFAULTS = RewardWeights().model_dump()


def _batches(store: Any, size: int) -> list[list[RunRecord]]:
    runs = list(store.iter_runs())
    return [runs[k : k + size] for k in range(0, len(runs), size)]


def _pair(store: Any, runs: list[RunRecord], review: ReviewColumns) -> tuple[Any, EvidenceColumns]:
    table = store.experiment_table_of_runs([r.id for r in runs])
    bundles = load_trusted_runs(store, runs, TrustedReview(store), steps=False)
    return EvidenceColumns.of_store(runs, table, review), EvidenceColumns.of_bundles(bundles)


def _same(a: EvidenceColumns, b: EvidenceColumns) -> None:
    assert a.n_runs == b.n_runs
    for name in ("counts", "measured", "proposal_counts", "backing", "reviewed"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    for name in ("verdict", "suspicious", "health_warning", "checked", "scores"):
        x, y = getattr(a.scored, name), getattr(b.scored, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name  # bit for bit, NaN too
    for name in ("speedup", "ci_low", "ci_high"):  # where measured: the others are never read
        x, y = getattr(a, name)[a.measured], getattr(b, name)[b.measured]
        assert x.tobytes() == y.tobytes(), name
    assert a.reviews.tobytes() == b.reviews.tobytes()
    for name in ("ids", "patch_ids", "proposal_ids", "proposal_patch_ids", "proposal_status"):
        assert getattr(a, name).to_pylist() == getattr(b, name).to_pylist(), name
    for k in range(len(a.ids)):
        x, y = a.experiment(k), b.experiment(k)
        assert (x.id, x.patch_id, x.result.verdict, x.result.flags) == (
            y.id, y.patch_id, y.result.verdict, list(y.result.flags)
        )  # fmt: skip


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_store_columns_give_the_evidence_of_the_bundles(tmp_path: Path, seed: int) -> None:
    random_rewards_store(tmp_path / "r.db", seed, gone=0.0, orphans=False, runs=60)
    store = open_store(tmp_path / "r.db", readonly=True)
    review = ReviewColumns(*store.review_tables())
    assert review.known
    for runs in _batches(store, 7):
        columns, bundles = _pair(store, runs, review)
        assert columns is not None  # the common shape: every batch read as columns
        _same(columns, bundles)


def test_a_batch_out_of_the_common_shape_gives_none(tmp_path: Path) -> None:
    """A proposal naming an experiment its run does not hold (recorded without the run id, or
    not in the store at all) sends its batch to the bundles, and only its batch."""
    random_rewards_store(tmp_path / "r.db", 4, gone=0.3, orphans=True, runs=60)
    store = open_store(tmp_path / "r.db", readonly=True)
    review = ReviewColumns(*store.review_tables())
    index = TrustedReview(store)
    outcomes = []
    for runs in _batches(store, 3):
        held = store.experiments_of_runs([r.id for r in runs])
        foreign = any(
            x not in {e.id for e in held.get(run.id, [])}
            for run in runs
            for p in index.proposals.get(run.id, [])
            for x in p.experiment_ids
        )
        columns, bundles = _pair(store, runs, review)
        assert (columns is None) == foreign
        if columns is not None:
            _same(columns, bundles)
        outcomes.append(foreign)
    assert any(outcomes) and not all(outcomes)


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE experiments SET verdict = 'MAYBE' WHERE rowid = 3",
        "UPDATE experiments SET flags = '[\"odd\"]' WHERE rowid = 3",
        "UPDATE experiments SET ci_low = NULL WHERE rowid IN"
        " (SELECT rowid FROM experiments WHERE metric IS NOT NULL LIMIT 1)",
    ],
)
def test_values_this_version_does_not_know_leave_the_columns(tmp_path: Path, sql: str) -> None:
    random_rewards_store(tmp_path / "r.db", 5, gone=0.0, orphans=False, runs=12)
    with sqlite3.connect(tmp_path / "r.db") as conn:
        assert conn.execute(sql).rowcount == 1
    store = open_store(tmp_path / "r.db", readonly=True)
    review = ReviewColumns(*store.review_tables())
    runs = list(store.iter_runs())
    assert (
        EvidenceColumns.of_store(runs, store.experiment_table_of_runs([r.id for r in runs]), review)
        is None
    )


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE proposals SET status = 'limbo' WHERE rowid = 1",
        "DROP TRIGGER decisions_append_only_u; UPDATE decisions SET action = 'shrug' WHERE rowid = 1",
    ],
)
def test_an_unknown_review_value_leaves_the_columns(tmp_path: Path, sql: str) -> None:
    random_rewards_store(tmp_path / "r.db", 6, gone=0.0, orphans=False, runs=12)
    with sqlite3.connect(tmp_path / "r.db") as conn:
        conn.executescript(sql)
    store = open_store(tmp_path / "r.db", readonly=True)
    assert not ReviewColumns(*store.review_tables()).known


_FILTERS = [
    ExportFilter(),
    ExportFilter(verdicts=[Verdict.IMPROVED, Verdict.FAILED]),
    ExportFilter(reviewed_only=True),
    ExportFilter(min_reward=0.3),
]


@pytest.mark.parametrize("fmt", CHAT)
@pytest.mark.parametrize("shape", ["common", "mixed"])
def test_parquet_exports_write_the_bytes_of_the_row_path(
    tmp_path: Path, fmt: ExportFormat, shape: str
) -> None:
    common = shape == "common"
    random_rewards_store(tmp_path / "r.db", 7, gone=0.0 if common else 0.2, orphans=not common)
    store = open_store(tmp_path / "r.db", readonly=True)
    for flt in _FILTERS:
        for batch_rows in (1, 5, 512):
            fast, slow = tmp_path / "fast.parquet", tmp_path / "slow.parquet"
            a = export_dataset(store, fmt, fast, parquet=True, flt=flt, batch_rows=batch_rows)
            b = export_dataset(store, fmt, slow, parquet=True, flt=flt, batch_rows=batch_rows,
                               trusted_bodies=False)  # fmt: skip
            assert fast.read_bytes() == slow.read_bytes(), (flt, batch_rows)
            assert a.model_dump(exclude={"path", "seconds"}) == b.model_dump(
                exclude={"path", "seconds"}
            )


def test_tool_specs_of_every_kind_are_the_row_paths(tmp_path: Path) -> None:
    """Runs that recorded their tools, called registry tools, unknown tools, none, or more
    distinct tools than the bit sets hold (63): the same `tools` as the row path."""
    store = open_store(tmp_path / "t.db")
    kinds: list[tuple[dict[str, Any], list[str]]] = [
        ({"tools": [{"type": "function", "function": {"name": "mine"}}]}, ["mine", "other"]),
        ({}, ["profile", "microbench"]),
        ({}, ["microbench", "profile", "profile"]),
        ({}, ["made_up"]),
        ({}, ["profile", "made_up"]),
        ({}, []),
        ({}, [f"tool_{k}" for k in range(70)]),
        ({"tools": "not a list"}, ["profile"]),
    ]
    for config, names in kinds:
        run = RunRecord(task="t", objective="latency", policy="llm", config=config)
        store.put_run(run)
        store.add_step(StepRecord(run_id=run.id, role="user", content="go"))
        calls = [ToolCall(id=f"c{k}", name=n, arguments="{}") for k, n in enumerate(names)]
        store.add_step(StepRecord(run_id=run.id, role="assistant", content="", tool_calls=calls))
    store.close()
    store = open_store(tmp_path / "t.db", readonly=True)
    for batch_rows in (1, 3, 512):
        fast, slow = tmp_path / "fast.parquet", tmp_path / "slow.parquet"
        export_dataset(store, ExportFormat.RL, fast, parquet=True, batch_rows=batch_rows)
        export_dataset(store, ExportFormat.RL, slow, parquet=True, batch_rows=batch_rows,
                       trusted_bodies=False)  # fmt: skip
        assert fast.read_bytes() == slow.read_bytes()
    specs = pq.read_table(fast).column("tools_json").to_pylist()
    assert len(specs) == len(kinds)  # in run order
    assert specs[1] == specs[2] == specs[7] and specs[5] == "[]" and len(set(specs)) == 6


def test_the_file_does_not_depend_on_the_batches(tmp_path: Path) -> None:
    """Fixed batch sizes, the sized batches of one process, and worker processes all write the
    same bytes (row groups are cut by rows, not by batch: `writers.ParquetSink`)."""
    random_rewards_store(tmp_path / "r.db", 8, gone=0.1, orphans=True, runs=60)
    store = open_store(tmp_path / "r.db", readonly=True)
    outputs = []
    for k, kwargs in enumerate([{}, {"batch_rows": 1}, {"batch_rows": 7}, {"jobs": 2}]):
        out = tmp_path / f"{k}.parquet"
        export_dataset(store, ExportFormat.RL, out, parquet=True, **kwargs)  # type: ignore[arg-type]
        outputs.append(out.read_bytes())
    assert all(o == outputs[0] for o in outputs)


@pytest.mark.parametrize("sizes", [[3, 4, 10, 1, 0, 9], [25], [7, 7, 7], [0, 2]])
def test_the_sink_cuts_row_groups_by_rows(tmp_path: Path, sizes: list[int]) -> None:
    rows = pa.table(
        {"k": list(range(sum(sizes))), "s": [f"v{k}" * (k % 5) for k in range(sum(sizes))]}
    )
    streamed, whole = tmp_path / "streamed.parquet", tmp_path / "whole.parquet"
    with open(streamed, "wb") as f:
        sink = ParquetSink(f, rows.schema, row_group_rows=7)
        at = 0
        for n in sizes:
            sink.write(rows.slice(at, n))
            at += n
        sink.finish()
        sink.close()
    pq.write_table(rows, whole, row_group_size=7, compression="zstd")
    assert streamed.read_bytes() == whole.read_bytes()
    meta = pq.ParquetFile(streamed).metadata
    groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    assert groups == [7] * (sum(sizes) // 7) + ([sum(sizes) % 7] if sum(sizes) % 7 else [])


def test_sized_batches_follow_the_rows_bytes() -> None:
    from infra_agent.trajectories import export as ex

    sizer = ex._Sizer(None)
    assert sizer() == ex.BATCH_ROWS
    sizer.saw(ex._Batch(payload=b"x" * 1000), runs=10)  # 100 bytes a run: as many as allowed
    assert sizer() == ex.MAX_BATCH_ROWS
    sizer.saw(
        ex._Batch(payload=b"x" * (ex.BATCH_BYTES // 2)), runs=4
    )  # an eighth of the budget a run
    assert sizer() == 8
    sizer.saw(ex._Batch(payload=b"x" * (ex.BATCH_BYTES * 3)), runs=1)  # one huge run
    assert sizer() == 1
    sizer.saw(ex._Batch(), runs=5)  # no rows: nothing learnt
    assert sizer() == 1
    fixed = ex._Sizer(3)
    fixed.saw(ex._Batch(payload=b"x"), runs=3)
    assert fixed() == 3


def test_a_number_read_back_as_null_off_the_best_candidate_exports(tmp_path: Path) -> None:
    """SQLite keeps a NaN or infinite speedup as NULL. On an experiment that is not a best
    candidate nothing reads it: the export gives the row path's rows."""
    random_rewards_store(tmp_path / "r.db", 9, gone=0.0, orphans=False, runs=20)
    with sqlite3.connect(tmp_path / "r.db") as conn:
        changed = conn.execute(
            "UPDATE experiments SET speedup = NULL, ci_high = NULL WHERE rowid IN (SELECT rowid"
            " FROM experiments WHERE metric IS NOT NULL AND verdict != 'IMPROVED' LIMIT 3)"
        ).rowcount
    assert changed == 3
    store = open_store(tmp_path / "r.db", readonly=True)
    out = tmp_path / "rl.parquet"
    export_dataset(store, ExportFormat.RL, out, parquet=True)
    bundles = load_trusted_runs(store, list(store.iter_runs()), TrustedReview(store))
    rows = [
        made.row for b in bundles if (made := run_row(b, ExportFormat.RL, DEFAULTS)).skip is None
    ]
    assert pq.read_table(out).to_pylist() == arrow_table(ExportFormat.RL, rows).to_pylist()
