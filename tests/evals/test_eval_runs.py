"""`infra-agent eval` end to end: real runs and experiments through the CLI, attempts as records,
sparse feedback hiding the instruments, the search policy over the seed suite, resume after a
kill, and the HTML report in headless Chromium."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import quick_decode_task, run_cli

from infra_agent.evals.records import EvalStore
from infra_agent.store import open_store

INSTRUMENTS = {"accuracy_diff", "profile", "microbench", "serving_workload", "lookup_skeletons"}
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "evals"


def _script(path: Path) -> Path:
    """Look (describe_task and an instrument), propose fewer splits, verify it."""
    replies = [
        {"content": "look", "tool_calls": [{"name": "describe_task"}, {"name": "profile", "arguments": {}}],
         "prompt_tokens": 100, "completion_tokens": 10},
        {"content": "fewer splits", "tool_calls": [{"name": "propose_knobs", "arguments": {
            "knobs": {"num_splits": 2}, "rationale": "each split re-reads the keys"}}],
         "prompt_tokens": 200, "completion_tokens": 20},
        {"content": "verify", "tool_calls": [{"name": "run_experiment", "arguments": {
            "patch_id": "{{last_patch_id}}"}}], "prompt_tokens": 300, "completion_tokens": 5},
    ]  # fmt: skip
    path.write_text(json.dumps(replies))
    return path


def _eval(db: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    done = run_cli("--db", str(db), "eval", *args, "--json", timeout=timeout)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _tool_answers(db: Path, run_id: str, name: str) -> list[str]:
    store = open_store(db, readonly=True)
    try:
        return [s.content for s in store.steps(run_id) if s.role == "tool" and s.name == name]
    finally:
        store.close()


def _run_tools(db: Path, run_id: str) -> list[str]:
    store = open_store(db, readonly=True)
    try:
        run = store.get_run(run_id)
        assert run is not None
        return list(run.config["tools"])
    finally:
        store.close()


@pytest.mark.slow
def test_scripted_eval_over_two_tasks_dense_and_sparse_and_the_html_report(tmp_path: Path) -> None:
    task = quick_decode_task(tmp_path)
    script = _script(tmp_path / "script.json")
    db = tmp_path / "runs.db"
    common = ["--suite", str(task), "--suite", "example-matmul", "--policy", "scripted",
              "--script", str(script), "--attempts", "1"]  # fmt: skip
    sparse = _eval(db, *common, "--feedback", "sparse")
    dense = _eval(db, *common, "--feedback", "dense")
    for report, feedback in ((sparse, "sparse"), (dense, "dense")):
        assert report["eval"]["feedback"] == feedback
        attempts = report["attempts"]
        assert [a["task"] for a in attempts] == [str(task), "example-matmul"]
        assert all(a["status"] == "finished" and a["run_id"] for a in attempts)
        by_task = {c["task"]: c for c in report["cells"]}
        result = attempts[0]["result"]
        assert len(result["verdicts"]) == 1  # one real experiment (its verdict is measured)
        won = result["verdicts"] == ["IMPROVED"]
        assert by_task[str(task)]["improved"] == int(won), result
        assert (result["reverification"] is not None) == won  # the win re-measured, once
        # a win not IMPROVED again when re-measured is set aside: neither solved nor best
        held = won and not result["reverification"]["disproved"]
        assert [a["why"] for a in result["set_aside"]] == ([] if held or not won else ["not held"])
        # solved: IMPROVED and the task's target (at least 1.5x, shown by the CI's low end)
        assert by_task[str(task)]["solved"] == int(held and result["criteria_met"] == [True])
        assert by_task["example-matmul"]["solved"] == 0  # it has no num_splits knob
        assert by_task["example-matmul"]["invalid_calls"] >= 2  # the knob and the experiment
        if held:
            assert by_task[str(task)]["best_speedup"] == result["speedups"][0] > 1.0
            assert by_task[str(task)]["first_win"]["experiments"] == 1
            assert by_task[str(task)]["first_win"]["tokens"] == 100 + 10 + 200 + 20 + 300 + 5
        else:
            assert by_task[str(task)]["first_win"]["experiments"] is None
        for a in attempts:  # the tool lists of its runs
            tools = set(_run_tools(db, a["run_id"]))
            answers = _tool_answers(db, a["run_id"], "profile")
            if feedback == "sparse":
                assert not tools & INSTRUMENTS and "run_experiment" in tools
                assert answers and answers[0].startswith("error: unknown tool 'profile'")
            else:
                assert INSTRUMENTS - {"serving_workload"} <= tools
                assert "serving_workload" not in tools  # offered only on serving tasks
                assert answers and "unknown tool" not in answers[0]
    exported = run_cli("--db", str(db), "export", "--eval", sparse["eval"]["id"], "--format",
                       "openai-sft", "--out", str(tmp_path / "sparse.jsonl"), "--json")  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    summary = json.loads(exported.stdout)
    assert summary["runs_in_store"] == 4 and summary["runs_matched"] == 2  # exactly its runs
    html = tmp_path / "report.html"
    both = run_cli("--db", str(db), "eval", "report", sparse["eval"]["id"], dense["eval"]["id"],
                   "--html", str(html))  # fmt: skip
    assert both.returncode == 0, both.stderr
    assert "sparse" in both.stdout and "dense" in both.stdout
    text = html.read_text()
    assert "http://" not in text and "https://" not in text  # self-contained
    if not Path(CHROMIUM).exists():
        pytest.skip("needs Debian's chromium (.ci/setup-system.sh) for the screenshot")
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"], headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1366, "height": 900})
            page.goto(html.as_uri())
            rows = page.locator("#metrics tbody tr")
            assert rows.count() == 6  # two tasks and the suite, for each eval
            assert page.locator("#metrics tbody tr.suite").count() == 2
            widths = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
            assert len(widths) == 3 and all(w > 200 for w in widths)
            shot = ARTIFACTS / "eval-report.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 20_000
        finally:
            browser.close()


@pytest.mark.slow
def test_search_eval_over_the_seed_suite_with_two_attempts(tmp_path: Path) -> None:
    """Over 60 s (100 s at load 6-8): two attempts on every task of the seed suite, the only
    test of an eval over the whole suite (n/a tasks, per-task cells, the search on each)."""
    db = tmp_path / "runs.db"
    report = _eval(db, "--suite", "seed", "--policy", "search", "--attempts", "2", "--budget", "2", timeout=1500)  # fmt: skip
    attempts = report["attempts"]
    assert len(attempts) == 2 * len(report["eval"]["tasks"]) and len(attempts) >= 14
    knobbed = [a for a in attempts if a["task"] == "decode-split-norm"]
    assert all(a["status"] == "finished" and a["result"]["experiments"] == 2 for a in knobbed)
    assert knobbed[0]["run_id"] != knobbed[1]["run_id"]
    others = [a for a in attempts if a["task"] != "decode-split-norm"]
    assert all(a["status"] == "not_applicable" and "no knobs" in a["reason"] for a in others)
    suite = report["cells"][-1]
    assert suite["task"] == "*" and suite["attempts"] == len(attempts)
    assert set(suite["fast_p"]) == {"1", "1.2", "1.5", "2"} and set(suite["pass_at_k"]) == {
        "1",
        "2",
    }
    store = open_store(db, readonly=True)
    try:
        for a in knobbed:
            run = store.get_run(a["run_id"])
            assert run is not None and run.policy == "search" and run.config["seed"] == a["index"]
            assert len(store.experiments(a["run_id"])) == 2
    finally:
        store.close()


def _attempt_states(db: Path) -> list[tuple[str, str | None]]:
    if not db.exists():
        return []
    try:
        store = EvalStore(db, readonly=True)
    except Exception:  # the file exists, its tables not yet
        return []
    try:
        evals = store.list_evals()
        return [(a.status, a.run_id) for a in store.attempts(evals[0].id)] if evals else []
    except Exception:
        return []
    finally:
        store.close()


@pytest.mark.slow
def test_an_eval_killed_mid_attempt_resumes_without_repeating_finished_attempts(
    tmp_path: Path,
) -> None:
    """About 60 s (66 s at load 6-8): an eval process is killed inside an attempt's experiment
    and resumed, so it runs that attempt's experiments twice and the others once."""
    task = quick_decode_task(tmp_path)
    script = _script(tmp_path / "script.json")
    db = tmp_path / "runs.db"
    args = ["--db", str(db), "eval", "--suite", str(task), "--policy", "scripted",
            "--script", str(script), "--attempts", "3"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra_agent.cli", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            states = _attempt_states(db)
            if len(states) == 3 and states[0][0] == "finished" and states[1][0] == "running":
                break
            assert proc.poll() is None, "the eval ended before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("the second attempt never started")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    before = _attempt_states(db)
    first_run = before[0][1]
    store = open_store(db, readonly=True)
    experiments_before = len(store.experiments(first_run))
    store.close()
    evals = EvalStore(db, readonly=True)
    eval_id = evals.list_evals()[0].id
    evals.close()
    report = _eval(db, "--resume", eval_id)
    attempts = report["attempts"]
    assert [a["status"] for a in attempts] == ["finished"] * 3
    assert attempts[0]["run_id"] == first_run  # the finished attempt was not run again
    store = open_store(db, readonly=True)
    try:
        assert len(store.experiments(first_run)) == experiments_before == 1
        linked = {a["run_id"] for a in attempts} | {
            r for a in attempts for r in a["abandoned_runs"]
        }
        assert {r.id for r in store.list_runs()} == linked  # no run outside the attempts
    finally:
        store.close()
    assert all(
        a["result"]["improved"] == (a["result"]["verdicts"] == ["IMPROVED"]) for a in attempts
    )
    shown = [(a["result"]["verdicts"], a["reason"], a["abandoned_runs"]) for a in attempts]
    assert all(len(a["result"]["verdicts"]) == 1 for a in attempts), shown


@pytest.mark.slow
def test_parallel_attempts_run_at_once_each_on_its_own_cores(tmp_path: Path) -> None:
    """`--parallel-attempts 2`: both attempts' experiments are under way at the same time (each
    waits at a gate until the other has started too: one after the other, the second never
    would), each attempt process pinned to a core set of its own."""
    from support import ExperimentGate

    task = quick_decode_task(tmp_path)
    gate = ExperimentGate(task, tmp_path / "gate", from_nth=1)
    script = _script(tmp_path / "script.json")
    db, log = tmp_path / "runs.db", tmp_path / "eval.log"
    args = ["--db", str(db), "eval", "--suite", str(task), "--policy", "scripted", "--script",
            str(script), "--attempts", "2", "--parallel-attempts", "2", "--no-reverify", "--json"]  # fmt: skip
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "infra_agent.cli", *args],
            stdout=subprocess.PIPE, stderr=err, start_new_session=True,
        )  # fmt: skip
    try:
        gate.wait_held(proc, log)
        deadline = time.monotonic() + 300
        while gate.started < 2:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        gate.release()
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-2000:]
    report = json.loads(out)
    attempts = report["attempts"]
    assert [a["status"] for a in attempts] == ["finished", "finished"]
    assert len({a["run_id"] for a in attempts}) == 2
    shown = [(a["result"]["verdicts"], a["reason"], a["abandoned_runs"]) for a in attempts]
    assert all(len(a["result"]["verdicts"]) == 1 for a in attempts), shown
    lines = [line for line in log.read_text().splitlines() if " started on cores " in line]
    first, second = ({int(c) for c in line.rsplit(" ", 1)[1].split(",")} for line in lines)
    assert first and second and not first & second, lines  # a core set of its own each
