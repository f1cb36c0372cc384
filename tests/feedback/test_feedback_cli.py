"""`infra-agent feedback accuracy|timeline|bench|gil`: --json gives one document, results stored."""

import json
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from infra_agent.cli import app
from infra_agent.feedback.accuracy import save_dump
from infra_agent.store import open_store

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from support import run_cli  # noqa: E402
from test_gil import PROGRAM, _py_spy_can_attach  # noqa: E402

runner = CliRunner()


def _json(args: list[str]) -> dict:
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_accuracy_on_dumps_is_stored(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    a = {f"layer{i}": torch.randn(4, 8, generator=g) for i in range(3)}
    b = {k: v.clone() for k, v in a.items()}
    b["layer1"][2, 5] += 1.0
    b["layer2"] += 0.5
    save_dump(a, tmp_path / "a")
    save_dump(b, tmp_path / "b")
    db = tmp_path / "runs.db"
    doc = _json(
        [
            "--db",
            str(db),
            "feedback",
            "accuracy",
            str(tmp_path / "a"),
            str(tmp_path / "b"),
            "--json",
        ]
    )
    assert doc["verdict"] == "FAIL" and doc["first_divergence"] == "layer1"
    assert doc["probes"][1]["diff"]["max_abs_at"] == [2, 5]
    (stored,) = open_store(db).feedback()
    assert stored.instrument == "accuracy" and stored.record["first_divergence"] == "layer1"
    assert stored.rendering.startswith("FAIL")
    text = runner.invoke(app, ["feedback", "accuracy", str(tmp_path / "a"), str(tmp_path / "a")])
    assert text.exit_code == 0 and "PASS" in text.stdout and "feedback accuracy" in text.stdout


def test_accuracy_sweep_from_a_python_file(tmp_path: Path) -> None:
    code = tmp_path / "growth.py"
    code.write_text(
        "import torch\n"
        "def run(n):\n"
        "    ref = torch.ones(4, dtype=torch.float64) * n\n"
        "    return ref + 1e-6 * n * n, ref\n"
    )
    doc = _json(
        ["feedback", "accuracy", "--sweep", f"{code}:run", "--sizes", "10,100,1000", "--json"]
    )
    assert doc["growth"] == "super-linear" and doc["slope_max_abs"] == pytest.approx(2.0, abs=0.01)


def test_timeline_trace_overlap(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "name": "kv_transfer",
            "cat": "user_annotation",
            "ts": 0,
            "dur": 40,
            "pid": 1,
            "tid": 1,
        },
        {
            "ph": "X",
            "name": "dispatch",
            "cat": "user_annotation",
            "ts": 30,
            "dur": 30,
            "pid": 1,
            "tid": 2,
        },
    ]
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    args = [
        "feedback",
        "timeline",
        str(trace),
        "--overlap-a",
        "kv_",
        "--overlap-b",
        "dispatch",
        "--json",
    ]
    doc = _json(args)
    assert doc["overlaps"][0]["ratio"] == 0.25 and doc["overlaps"][0]["exposed_a_us"] == 30
    diff = _json([*args[:3], "--against", str(trace), "--json"])
    assert diff["changes"] == []


def test_bench_detects_a_slower_function(tmp_path: Path) -> None:
    code = tmp_path / "kernels.py"
    code.write_text(
        "def fast():\n    sum(i * i for i in range(2000))\n\n"
        "def slow():\n    sum(i * i for i in range(6000))\n"
    )
    args = [
        "feedback",
        "bench",
        f"{code}:fast",
        f"{code}:slow",
        "--clock",
        "cpu",
        "--budget-s",
        "4",
    ]
    doc = _json([*args, "--min-sample-ms", "2", "--json"])
    # The CLI's part: both functions timed in their workers, one JSON document with the
    # comparison and every sample. Which way the clock reads is the engine's business
    # (test_bench_runner.py on work counts; benchmarks/bench_feedback_bench.py on the clock).
    c = doc["comparison"]
    assert c["verdict"] in ("SLOWER", "SAME", "FASTER", "AMBIGUOUS")
    assert c["ci_low"] <= c["speedup"] <= c["ci_high"]
    assert len(doc["baseline_samples_s"]) == c["n_baseline"] >= 3


@pytest.mark.parametrize("sampler", [None, "dump"])
def test_gil_on_a_started_script(tmp_path: Path, sampler: str | None) -> None:
    why = _py_spy_can_attach()
    if why is not None:
        pytest.skip(f"py-spy cannot attach here: {why}")
    script = tmp_path / "two_threads.py"
    script.write_text(PROGRAM)
    # dump's default of one snapshot a second gave 2 snapshots in 2 s, and CI once caught the io
    # thread between waits in both: 0.2 s gives ~10 (io waited in 5-9 of 10 under load 4).
    choice = ["--sampler", sampler, "--interval-s", "0.2"] if sampler else []
    doc = _json(["feedback", "gil", str(script), "--duration-s", "2", *choice, "--json"])
    assert (sampler or "record") in doc["method"]
    assert doc["gil_visible"] is True
    assert {t["thread"] for t in doc["threads"]} >= {"spinner", "io", "MainThread"}
    io = [b for b in doc["blame"] if b["waiter"] == "io"]
    assert io and "spinner" in [e["holder"] for e in io[0]["evidence"]], doc["blame"]


def test_gil_sampler_must_be_known() -> None:
    done = run_cli("feedback", "gil", "--pid", "1", "--sampler", "perf", "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert "--sampler must be 'record' or 'dump'" in done.stderr


def test_bad_input_is_one_line_error_and_no_stdout(tmp_path: Path) -> None:
    done = run_cli("feedback", "bench", "no_such_module_xyz:f", "os:getpid", "--json")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().startswith("error: cannot import module 'no_such_module_xyz'")
    assert len(done.stderr.strip().splitlines()) == 1


def test_user_code_failure_is_a_one_line_error(tmp_path: Path) -> None:
    from infra_agent.errors import UserError

    code = tmp_path / "broken.py"
    code.write_text("def path():\n    raise ValueError('shape is wrong')\n")
    with pytest.raises(UserError, match="broken.py:path raised ValueError: shape is wrong"):
        runner.invoke(
            app, ["feedback", "accuracy", f"{code}:path", f"{code}:path"], catch_exceptions=False
        )
