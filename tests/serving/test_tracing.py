"""Profiles and GIL traces of server processes during a workload (`serving.instruments.tracing`) and the
`server_profile` tool's refusals, on real processes without an SGLang server: a busy Python
child stands in for the scheduler, a workload that only waits stands in for the load."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from infra_agent.feedback.gil import GilReport, PySpyUnavailable, ThreadBlame, ThreadGil, pyspy
from infra_agent.feedback.pyprofile import FunctionTime
from infra_agent.serving.instruments import tracing
from infra_agent.serving.load.generator import LoadSpec, WorkloadResult
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

BUSY = "import random\ndata = [random.random() for _ in range(200000)]\n" + (
    "def hot():\n    return sorted(data)\nwhile True:\n    hot()\n"
)


class WaitingServer:
    """Stands in for `Server`: its workload waits `seconds` and returns an empty result."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def call(self, fn: Any, *args: Any) -> WorkloadResult:
        time.sleep(self.seconds)
        return WorkloadResult(records=[], duration_s=self.seconds, load=LoadSpec())

    def cpu_seconds(self) -> float:
        return 0.0  # no cgroup to count, as a Server without one


@pytest.fixture
def busy_scheduler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> subprocess.Popen[bytes]:
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "busy.py").write_text(BUSY)
    child = subprocess.Popen([sys.executable, str(package / "busy.py")])
    monkeypatch.setattr(tracing, "server_processes", lambda server: {"scheduler": child.pid})
    monkeypatch.setattr(tracing, "package_dirs_of", lambda server: [package])
    time.sleep(0.5)
    yield child
    child.kill()
    child.wait()


def test_each_process_gets_its_profile_and_gil_and_a_missing_one_an_error(
    busy_scheduler: subprocess.Popen[bytes],
) -> None:
    report = tracing.profile_server(
        WaitingServer(3.0), [], LoadSpec(), ["scheduler", "detokenizer"],  # type: ignore[arg-type]
        label="baseline", gil_s=1.0,
    )  # fmt: skip
    scheduler, detokenizer = report.processes
    assert scheduler.pid == busy_scheduler.pid and scheduler.samples > 20
    assert scheduler.top_self[0].where == "sglang/busy.py:hot"
    assert scheduler.top_self[0].self_share > 0.5
    assert scheduler.gil is not None and not scheduler.errors
    (main,) = scheduler.gil.threads  # named by its thread id: the child names no threads
    # It computes all the time: never idle. Whether py-spy reads it as holding the GIL or as
    # running without it is not asserted: with two busy processes on the two cores it read 50%
    # "runs-no-GIL" in 11 samples (a suite run failed on `holding > 0.5`). Idle in 6 of 11
    # samples would need py-spy to see a thread that never sleeps asleep.
    assert main.idle < 0.5 and main.holding + main.running > 0.5
    # It computed through the 3 s workload: its CPU is counted (most of a core, less on a
    # loaded machine); a missing process has none.
    assert scheduler.cpu_s is not None and 0.3 < scheduler.cpu_s < 3.0 * 1.1, scheduler.cpu_s
    assert detokenizer.pid is None and detokenizer.gil is None and detokenizer.cpu_s is None
    assert detokenizer.errors == [
        f"the server has no detokenizer process (found: scheduler {busy_scheduler.pid})"
    ]
    text = report.render()
    assert text.startswith("baseline: 0 requests, 0 output tokens in 3.0 s")
    assert f"scheduler (pid {busy_scheduler.pid}): {scheduler.cpu_s:.1f} CPU-s (" in text
    assert "sglang/busy.py:hot" in text
    assert f"GIL {main.thread}: holds" in text
    assert "error: the server has no detokenizer process" in text
    assert json.loads(report.model_dump_json())["processes"][0]["role"] == "scheduler"


def test_a_dead_process_is_one_line_per_instrument(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setattr(tracing, "server_processes", lambda server: {"tokenizer": gone.pid})
    traces, _ = tracing.trace_during(
        WaitingServer(0.5),
        [],
        LoadSpec(),
        ["tokenizer"],
        gil_s=1.0,  # type: ignore[arg-type]
    )
    errors = traces[0].errors
    assert [e.split(":", 1)[0] for e in errors] == ["profile", "gil"]
    assert all(f"the tokenizer process (pid {gone.pid}) died during the workload" in e
               for e in errors)  # fmt: skip
    assert all("\n" not in e for e in errors)
    with pytest.raises(tracing.UserError, match="unknown server process 'gpu'"):
        tracing.trace_during(WaitingServer(0), [], LoadSpec(), ["gpu"])  # type: ignore[arg-type]


def test_the_rendering_stays_bounded_with_every_process_and_many_threads() -> None:
    row = FunctionTime(
        function="Scheduler." + "x" * 60, file="sglang/srt/managers/" + "y" * 40 + ".py",
        self_samples=10, total_samples=20, self_share=0.1, total_share=0.2,
    )  # fmt: skip
    threads = [
        ThreadGil(thread=f"worker-{i}", thread_id=i, samples=100, holding=0.3, waiting=0.3,
                  running=0.2, idle=0.2, top_functions=["f" * 80 + " 50%"])
        for i in range(30)
    ]  # fmt: skip
    gil = GilReport(
        method="m", gil_visible=True, snapshots=100, duration_s=4.0, threads=threads,
        blame=[ThreadBlame(waiter=f"worker-{i}", waiting=0.3) for i in range(10)],
        warnings=["w" * 300] * 5,
    )  # fmt: skip
    processes = [
        tracing.ProcessProfile(role=r, pid=1, samples=9, duration_s=3.0, top_self=[row] * 20,
                               top_total=[row.model_copy(update={"function": f"f{i}"})
                                          for i in range(20)], gil=gil)
        for r in tracing.ROLES
    ]  # fmt: skip
    report = tracing.ServerProfile(
        label="baseline", workload="w", duration_s=3.0, gil_window_s=4.0, processes=processes
    )
    text = report.render()
    # The worst case (every line at its width) stays under the tools' cut (6000 characters).
    assert len(text.splitlines()) <= 40 and len(text) < 5500, text
    assert "w" * 300 not in text  # the tracer's warnings stay in the data
    assert text.count("9 active samples in 3.0 s (few: the shares are rough") == 3


def test_a_profile_much_longer_than_its_workload_says_the_rest_is_waiting() -> None:
    """A relay model read idle-loop rows of an 8.3 s profile around a 4.6 s workload as the
    workload's: the rendering says how much of the profile the workload was."""

    def report(profiled: float) -> str:
        process = tracing.ProcessProfile(role="scheduler", pid=1, samples=400, duration_s=profiled)
        return tracing.ServerProfile(label="b", workload="w", duration_s=4.6, processes=[process]).render()  # fmt: skip

    assert "note: the profiles ran 8.3 s, the workload 4.6 s: the rest is the server waiting" in report(8.3)  # fmt: skip
    assert "note: the profiles ran" not in report(5.0)


def test_a_long_profile_gives_up_its_coolest_rows_first() -> None:
    """Over `RENDER_CHARS`, function rows go in order of least self time, across processes,
    down to one a process; the record keeps them all."""

    def row(name: str, share: float) -> FunctionTime:
        return FunctionTime(
            function=f"Scheduler.{name}_" + "x" * 110, file="sglang/srt/managers/" + "y" * 40 + ".py",
            self_samples=int(1000 * share), total_samples=int(1000 * share), self_share=share,
            total_share=share,
        )  # fmt: skip

    shares = {
        "scheduler": [0.40, 0.20, 0.09, 0.05, 0.02],
        "tokenizer": [0.30, 0.10, 0.07, 0.03, 0.01],
    }
    report = tracing.ServerProfile(
        label="baseline", workload="w" * 900, duration_s=10.0,
        processes=[
            tracing.ProcessProfile(role=role, pid=1, samples=1000, duration_s=10.0,
                                   top_self=[row(f"{role}{i}", v) for i, v in enumerate(values)])
            for role, values in shares.items()
        ],
    )  # fmt: skip
    assert len(report._render([5, 5])) >= tracing.RENDER_CHARS  # this case needs cutting
    text = report.render()
    assert len(text) < tracing.RENDER_CHARS, len(text)
    kept = {(role, v) for role, values in shares.items() for i, v in enumerate(values)
            if f"Scheduler.{role}{i}_" in text}  # fmt: skip
    gone = {(role, v) for role, values in shares.items() for v in values} - kept
    assert gone and min(v for _, v in kept) >= max(v for _, v in gone), (kept, gone)
    assert {role for role, _ in kept} == set(shares)
    assert len(report.processes[1].top_self) == 5


def test_server_profile_refuses_bad_processes_and_kernel_tasks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reg = default_registry()
    serving = ToolContext(
        task=find_task("sglang-cpu-tiny"), store=open_store(tmp_path / "r.db"), run_id="r"
    )
    bad = reg.call("server_profile", json.dumps({"processes": ["scheduler", "gpu"]}), serving)
    assert bad.error is not None and "\n" not in bad.error
    assert "'processes.1'" in bad.error and "'tokenizer'" in bad.error
    empty = reg.call("server_profile", json.dumps({"processes": []}), serving)
    assert empty.error is not None and "'processes'" in empty.error
    many = reg.call("server_profile", json.dumps({"num_prompts": 100000}), serving)
    assert many.error is not None and "'num_prompts'" in many.error
    kernel = ToolContext(
        task=find_task("decode-split-norm"), store=open_store(tmp_path / "k.db"), run_id="k"
    )
    refused = reg.call("server_profile", "{}", kernel)
    assert refused.error is not None and "not a serving task" in refused.error

    def missing() -> str:
        raise PySpyUnavailable("py-spy not found (pip install py-spy)")

    monkeypatch.setattr(pyspy, "find_py_spy", missing)  # refused before a server starts
    none = reg.call("server_profile", "{}", serving)
    assert none.error == "server_profile: py-spy not found (pip install py-spy)"


def test_by_total_the_entry_chain_is_one_row_its_innermost_and_wrappers_are_skipped(
    tmp_path: Path,
) -> None:
    from infra_agent.feedback.pyprofile import FunctionProfile

    f = str(tmp_path / "sglang" / "srt" / "scheduler.py")

    def stack(*names: str) -> str:
        return "thread (1): MainThread;" + ";".join(f"{n} ({f}:1)" for n in names)

    wrapper = "profile.<locals>.decorator.<locals>.wrapper"  # around each loop iteration
    entry = ("run_scheduler_process", "Scheduler.run_event_loop", "Scheduler.event_loop", wrapper)
    profile = FunctionProfile(pid=1, duration_s=1, samples=100, stacks={
        stack(*entry, "Scheduler.run_batch", "Model.forward"): 60,
        stack(*entry, "Scheduler.recv_requests"): 30, stack(*entry): 10,
    })  # fmt: skip
    trace = tracing.ProcessTrace(role="scheduler", pid=1, profile=profile)
    rows = tracing.ProcessProfile.of(trace, [tmp_path / "sglang"]).top_total
    assert [r.function for r in rows] == [
        "Scheduler.event_loop",
        "Model.forward",
        "Scheduler.run_batch",
        "Scheduler.recv_requests",
    ]
    assert [r.total_share for r in rows] == [1.0, 0.6, 0.6, 0.3]
