"""Timeline: exact overlap on synthetic traces, torch.profiler traces of annotated threads, diff."""

import json
import sqlite3
import threading
from pathlib import Path

import pytest
import torch
from torch.profiler import record_function

from infra_agent.errors import UserError
from infra_agent.feedback.timeline import (
    covered_fractions,
    diff_summaries,
    intersection_length,
    load_trace,
    profile_callable,
    profile_script,
    summarize,
)


def _x(name: str, ts: float, dur: float, tid: int, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_exact_overlap_of_synthetic_trace(tmp_path: Path) -> None:
    events = [
        _x("kv_transfer", 0, 10, 1),
        _x("kv_transfer", 20, 10, 1),
        _x("kv_transfer", 50, 10, 1),
        _x("dispatch", 5, 20, 2),
        _x("dispatch", 8, 4, 2),  # nested inside the previous one: must count once
        _x("dispatch", 55, 45, 2),
        _x("aten::mm", 60, 30, 2, "cpu_op"),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = summarize(load_trace(path), overlaps=[("kv_transfer", "dispatch")])
    (o,) = s.overlaps
    # A = [0,10] [20,30] [50,60]; B = [5,25] [55,100]; A∩B = [5,10] [20,25] [55,60].
    assert o.time_a_us == 30 and o.time_b_us == 65
    assert o.overlap_us == 15 and o.ratio == 0.5 and o.exposed_a_us == 15
    track2 = next(t for t in s.tracks if t.track == "1:2")
    assert track2.busy_us == 65 and track2.span_us == 95 and track2.idle_us == 30
    # Self time: dispatch [55,100] contains aten::mm [60,90].
    assert s.ops[0].name == "aten::mm" and s.ops[0].total_us == 30


def test_host_tracks_are_named_by_thread(tmp_path: Path) -> None:
    """Workers of one name that ran one after the other share a track; two that overlapped stay
    apart ('name (tid)'); a thread nobody named keeps 'pid:tid'."""
    events = [
        _x("aten::mm", 0, 10, 10, "cpu_op"),
        _x("aten::copy_", 2, 3, 11, "cpu_op"),  # kv-transfer, first call
        _x("aten::copy_", 20, 3, 12, "cpu_op"),  # kv-transfer, started anew for the second call
        _x("aten::add", 0, 5, 13, "cpu_op"),  # two pool threads at once
        _x("aten::add", 1, 5, 14, "cpu_op"),
        _x("aten::sum", 0, 1, 15, "cpu_op"),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    names = {10: "MainThread", 11: "kv-transfer", 12: "kv-transfer", 13: "pool", 14: "pool"}
    tracks = {t.track: t for t in summarize(load_trace(path, thread_names=names)).tracks}
    assert set(tracks) == {"MainThread", "kv-transfer", "pool (13)", "pool (14)", "1:15"}
    assert tracks["kv-transfer"].busy_us == 6.0 and tracks["kv-transfer"].top_op == "aten::copy_"
    assert {t.track for t in summarize(load_trace(path)).tracks} == {
        f"1:{i}" for i in range(10, 16)
    }


def test_intersection_sweep_matches_brute_force() -> None:
    import random

    rng = random.Random(3)
    for _ in range(50):
        a = [(s, s + rng.randint(1, 9)) for s in (rng.randint(0, 90) for _ in range(6))]
        b = [(s, s + rng.randint(1, 9)) for s in (rng.randint(0, 90) for _ in range(6))]
        covered = sum(
            1 for t in range(100) if any(x <= t < y for x, y in a) and any(x <= t < y for x, y in b)
        )
        assert intersection_length(a, b) == covered
        shares = covered_fractions(a, b)
        for (x, y), share in zip(a, shares, strict=True):  # a's intervals are never empty here
            inside = sum(1 for t in range(x, y) if any(u <= t < v for u, v in b))
            assert share == inside / (y - x)


def _spin(n: int = 10) -> None:
    x = torch.randn(128, 128)
    for _ in range(n):
        torch.tanh(x @ x.T / 128)


def _annotated_program(nested: bool) -> None:
    """nested: kv_transfer runs entirely inside dispatch; else it starts first and its tail
    overlaps dispatch. Ordering is forced by events, not by timing."""
    kv_open, dispatch_open, kv_closed = threading.Event(), threading.Event(), threading.Event()

    def transfer() -> None:
        if nested:
            dispatch_open.wait()
        with record_function("kv_transfer"):
            _spin()
            kv_open.set()
            dispatch_open.wait()
        kv_closed.set()

    t = threading.Thread(target=transfer, name="transfer")
    t.start()
    if not nested:
        kv_open.wait()
    with record_function("dispatch"):
        dispatch_open.set()
        _spin()
        kv_closed.wait()
        _spin(2)
    t.join()


@pytest.mark.parametrize("nested", [True, False])
def test_overlap_of_torch_profiler_trace_of_annotated_threads(nested: bool) -> None:
    events = profile_callable(lambda: _annotated_program(nested))
    s = summarize(events, overlaps=[("^kv_transfer$", "^dispatch$")])
    kv = [e for e in events if e.name == "kv_transfer"]
    disp = [e for e in events if e.name == "dispatch"]
    assert len(kv) == 1 and len(disp) == 1
    assert (kv[0].track, disp[0].track) == ("transfer", "MainThread")  # named, not pid:tid
    (o,) = s.overlaps
    if nested:  # kv_transfer ran entirely inside dispatch
        assert o.ratio == 1.0 and o.exposed_a_us == 0.0
    else:  # kv_transfer started first; only its tail overlaps dispatch
        expected = kv[0].end_us - disp[0].start_us
        assert 0 < expected < kv[0].dur_us
        assert o.overlap_us == pytest.approx(expected, abs=1e-3)
        assert o.exposed_a_us == pytest.approx(disp[0].start_us - kv[0].start_us, abs=1e-3)
    assert any(op.name == "aten::mm" for op in s.top_ops)
    assert "overlap 'kv_transfer'" in s.render().replace("^", "").replace("$", "")


def test_a_profiled_script_records_its_threads_by_name(tmp_path: Path) -> None:
    script = tmp_path / "two_threads.py"
    script.write_text(
        "import threading, torch\n"
        "def work():\n    torch.randn(64, 64) @ torch.randn(64, 64)\n"
        "t = threading.Thread(target=work, name='kv-transfer'); t.start(); t.join()\n"
        "torch.randn(8).sum()\n"
    )
    events = profile_script([str(script)], tmp_path / "trace.json")
    tracks = {e.track for e in events}
    assert {"kv-transfer", "MainThread"} <= tracks, tracks
    assert any(e.name == "aten::mm" and e.track == "kv-transfer" for e in events)


def test_warnings_and_diff() -> None:
    one_thread = [
        _x("kv_transfer", 0, 10, 1),
        _x("dispatch", 20, 10, 1),
        _x("aten::add", 0, 10, 1, "cpu_op"),
    ]
    from infra_agent.feedback.timeline.events import _chrome_events

    base = summarize(_chrome_events({"traceEvents": one_thread}), overlaps=[("kv", "dispatch")])
    assert base.overlaps[0].ratio == 0.0
    assert any("one thread" in w for w in base.warnings)
    base_events = [_x("aten::add", 0, 10, 1, "cpu_op"), _x("aten::sub", 20, 5, 1, "cpu_op")]
    cand_events = [_x("aten::add", 0, 4, 1, "cpu_op"), _x("aten::mul", 5, 3, 1, "cpu_op")]
    d = diff_summaries(
        summarize(_chrome_events({"traceEvents": base_events})),
        summarize(_chrome_events({"traceEvents": cand_events})),
    )
    status = {c.name: c.status for c in d.changes}
    assert status == {"aten::add": "faster", "aten::sub": "vanished", "aten::mul": "appeared"}
    assert d.changes[0].name == "aten::add" and d.changes[0].delta_us == -6


def test_nsys_sqlite_export(tmp_path: Path) -> None:
    db = tmp_path / "report.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, deviceId INT,
            streamId INT, shortName INT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, deviceId INT, streamId INT);
        INSERT INTO StringIds VALUES (1, 'gemm'), (2, 'ncclAllReduce');
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (0, 10000, 0, 7, 1), (12000, 20000, 0, 7, 1),
            (5000, 15000, 0, 9, 2);
        INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (30000, 31000, 0, 7);
        """
    )
    conn.commit()
    conn.close()
    s = summarize(load_trace(db), overlaps=[("nccl", "gemm")])
    assert s.ops_kind == "device"
    assert s.overlaps[0].ratio == pytest.approx(0.8)  # [5,15] under [0,10]+[12,20] us
    stream7 = next(t for t in s.tracks if t.track == "gpu0:stream7")
    assert stream7.classes_us["memcpy"] == pytest.approx(1.0)
    gaps = next(g for g in s.launch_gaps if g.track == "gpu0:stream7")
    assert gaps.count == 2 and gaps.total_us == pytest.approx(12.0)


def test_bad_trace_is_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    with pytest.raises(UserError):
        load_trace(bad)
    with pytest.raises(UserError):
        load_trace(tmp_path / "missing.json")
