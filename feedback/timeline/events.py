"""Timeline events from a trace: Kineto/Chrome trace JSON or an Nsight Systems SQLite export.

`load_trace(path) -> list[TraceEvent]` picks the reader by content. Times are microseconds.
A *track* is where events run one after another: a host thread (its name when the caller knows
the thread names, else `pid:tid`) or a device stream
(`gpu<device>:stream<id>`); `on_device` says which.
Kineto categories used: cpu_op, user_annotation, python_function (host); kernel, gpu_memcpy,
gpu_memset, gpu_user_annotation (device); cuda_runtime / cuda_driver (host API calls).
Nsight Systems tables used when present: CUPTI_ACTIVITY_KIND_KERNEL, _MEMCPY, _MEMSET,
_RUNTIME, NVTX_EVENTS, StringIds (times in ns there).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from pydantic import BaseModel

from infra_agent.errors import UserError

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


class TraceEvent(BaseModel):
    name: str
    category: str
    start_us: float
    dur_us: float
    track: str
    on_device: bool = False

    @property
    def end_us(self) -> float:
        return self.start_us + self.dur_us


def _chrome_events(doc: object, thread_names: dict[int, str] | None = None) -> list[TraceEvent]:
    raw = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(raw, list):
        raise UserError("trace JSON has no 'traceEvents' list")
    events = []
    host_ids: list[tuple[object, object]] = []
    for e in raw:
        if not isinstance(e, dict) or e.get("ph") != "X" or "dur" not in e:
            continue
        cat = str(e.get("cat", ""))
        if cat in ("Trace", "overhead") or cat.startswith("python_function"):
            continue
        on_device = cat in DEVICE_CATEGORIES
        pid, tid = e.get("pid", 0), e.get("tid", 0)
        track = f"gpu{pid}:stream{tid}" if on_device else f"{pid}:{tid}"
        events.append(
            TraceEvent(
                name=str(e.get("name", "?")),
                category=cat,
                start_us=float(e.get("ts", 0.0)),
                dur_us=float(e["dur"]),
                track=track,
                on_device=on_device,
            )
        )
        host_ids.append((None, None) if on_device else (pid, tid))
    if thread_names:
        _name_host_tracks(events, host_ids, thread_names)
    return events


def _name_host_tracks(
    events: list[TraceEvent], ids: list[tuple[object, object]], names: dict[int, str]
) -> None:
    """Host tracks 'pid:tid' become the thread's name; threads of one name that ran one after
    the other (a worker started per call) share it, ones that overlapped are 'name (tid)'."""
    spans: dict[str, tuple[float, float]] = {}
    for e in events:
        first, last = spans.get(e.track, (e.start_us, e.end_us))
        spans[e.track] = (min(first, e.start_us), max(last, e.end_us))
    label: dict[str, str] = {}
    by_name: dict[str, list[str]] = {}
    for e, (_, tid) in zip(events, ids, strict=True):
        if e.track in label or not isinstance(tid, int) or tid not in names:
            continue
        label[e.track] = names[tid]
        by_name.setdefault(names[tid], []).append(e.track)
    for name, tracks in by_name.items():
        ordered = sorted(tracks, key=lambda t: spans[t])
        if any(spans[b][0] < spans[a][1] for a, b in zip(ordered, ordered[1:], strict=False)):
            for t in tracks:
                label[t] = f"{name} ({t.rsplit(':', 1)[-1]})"
    for e in events:
        e.track = label.get(e.track, e.track)


def load_chrome_trace(path: Path, thread_names: dict[int, str] | None = None) -> list[TraceEvent]:
    """Complete ('X') events of a Chrome/Kineto trace (python_function events are skipped).
    `thread_names` (OS thread id -> name) names the host tracks (see `_name_host_tracks`)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read trace JSON {path}: {exc}") from exc
    return _chrome_events(doc, thread_names)


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def load_nsys_sqlite(path: Path) -> list[TraceEvent]:
    """Kernels, memcpy/memset, CUDA runtime calls and NVTX ranges of an `nsys export --type sqlite`."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        tables = _tables(conn)
    except sqlite3.Error as exc:
        raise UserError(f"cannot open Nsight Systems export {path}: {exc}") from exc
    names: dict[int, str] = {}
    if "StringIds" in tables:
        names = dict(conn.execute("SELECT id, value FROM StringIds").fetchall())
    events: list[TraceEvent] = []

    def add(name: str, cat: str, start: int, end: int, track: str, dev: bool) -> None:
        events.append(TraceEvent(name=name, category=cat, start_us=start / 1e3,
                                 dur_us=(end - start) / 1e3, track=track, on_device=dev))  # fmt: skip

    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        q = "SELECT start, end, deviceId, streamId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL"
        for start, end, dev, stream, name_id in conn.execute(q):
            add(
                names.get(name_id, str(name_id)),
                "kernel",
                start,
                end,
                f"gpu{dev}:stream{stream}",
                True,
            )
    for table, cat, label in (
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "gpu_memcpy", "Memcpy"),
        ("CUPTI_ACTIVITY_KIND_MEMSET", "gpu_memset", "Memset"),
    ):
        if table in tables:
            q = f"SELECT start, end, deviceId, streamId FROM {table}"
            for start, end, dev, stream in conn.execute(q):
                add(label, cat, start, end, f"gpu{dev}:stream{stream}", True)
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        q = "SELECT start, end, globalTid, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME"
        for start, end, tid, name_id in conn.execute(q):
            add(names.get(name_id, str(name_id)), "cuda_runtime", start, end, f"host:{tid}", False)
    if "NVTX_EVENTS" in tables:
        q = "SELECT start, end, globalTid, text, textId FROM NVTX_EVENTS WHERE end IS NOT NULL"
        for start, end, tid, text, text_id in conn.execute(q):
            name = text if text is not None else names.get(text_id, "nvtx")
            add(name, "user_annotation", start, end, f"host:{tid}", False)
    conn.close()
    if not events:
        raise UserError(f"{path} has no kernel, memcpy, runtime or NVTX rows")
    return events


def load_trace(path: str | Path, thread_names: dict[int, str] | None = None) -> list[TraceEvent]:
    """Read a Kineto/Chrome JSON trace (.json, .json.gz not supported) or an nsys SQLite export;
    `thread_names` (OS thread id -> name) names a Chrome trace's host threads."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"trace file not found: {p}")
    with p.open("rb") as fh:
        head = fh.read(16)
    if head.startswith(b"SQLite format 3"):
        return load_nsys_sqlite(p)
    return load_chrome_trace(p, thread_names)
