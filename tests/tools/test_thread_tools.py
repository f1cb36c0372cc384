"""The thread-aware instruments as the model calls them, on kv-transfer-gil (a transfer thread
beside the main thread): `profile` records every thread by name; `gil_trace` attaches the GIL
tracer to the task's code and blames the dispatch path that keeps the GIL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra_agent.feedback.gil import GilReport
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

SETUP = "import torch\nfrom scheduler import run_steps\nkv = torch.randn(6, 3, 8192)"
RUN = "run_steps(kv, moe_layers=1, dispatch_wait_us=20000, chunk_wait_us=4000)"


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    task = find_task("kv-transfer-gil")
    return ToolContext(task=task, store=open_store(tmp_path / "runs.db"), run_id="run-test")


def test_profile_records_the_transfer_thread_by_name(ctx: ToolContext) -> None:
    result = default_registry().call(
        "profile", json.dumps({"setup": SETUP, "code": RUN, "repeat": 2}), ctx
    )
    assert result.error is None and result.data is not None, result.error
    tracks = {t["track"]: t for t in result.data["summary"]["tracks"]}
    assert {"MainThread", "kv-transfer"} <= set(tracks), result.content
    # the transfer thread's own work: its chunk copies into the receive buffer
    assert tracks["kv-transfer"]["busy_us"] > 0
    assert "host kv-transfer: busy" in result.content and "host MainThread: busy" in result.content


def test_gil_trace_blames_the_dispatch_path_for_the_transfer_threads_waits(
    ctx: ToolContext,
) -> None:
    reg = default_registry()
    result = reg.call("gil_trace", json.dumps({"setup": SETUP, "code": RUN, "seconds": 2}), ctx)
    assert result.error is None and result.data is not None, result.error
    report = GilReport.model_validate(result.data)
    threads = {t.thread: t for t in report.threads}
    assert {"MainThread", "kv-transfer"} <= set(threads), result.content
    # Seen waiting at all (in native frames): its share is sampled and shrinks with the load
    # (a suite run at load 6-8 read 13% of 100 samples, where quiet runs read over 20%); at 13%,
    # no waiting sample in 100 has odds 0.87**100 = 9e-7.
    assert threads["kv-transfer"].waiting > 0.0, result.content
    assert threads["MainThread"].holding > threads["kv-transfer"].holding
    culprit = report.culprit()
    assert (culprit.thread, culprit.function) == ("MainThread", "dispatch.py:intranode_dispatch")
    first = result.content.splitlines()[0]
    if report.blame:  # waits past the blame threshold (20%), as on a quiet machine
        assert first.startswith("thread 'kv-transfer' waits for the GIL") and "(at " in first
    assert len(result.content) < 2000
    broken = reg.call("gil_trace", json.dumps({"setup": "import no_such_module", "code": "1"}), ctx)
    assert broken.error and "exited" in broken.error and "no_such_module" in broken.error
    bad = reg.call("gil_trace", json.dumps({"setup": "", "code": "run_steps(("}), ctx)
    assert bad.error and "code is not valid Python" in bad.error
