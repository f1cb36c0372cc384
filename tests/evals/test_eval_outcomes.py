"""What an eval counts, on real runs and experiments through the CLI: solved is the task's own
success criterion (not IMPROVED alone), each attempt's best win is re-measured on fresh seeds
("claims disproved": set aside, never solved), recorded so that a resume does not measure it
again; and several LLM
profiles in one eval (against the stand-in for the paid endpoint), each attempt with its own.

The tasks are copies of decode-split-norm with test equipment appended to their harness (like
tests/support.py's ExperimentGate): in the first experiment of a copy the baseline arm runs with
16 splits (keys read 17 times a step against the candidate's 3), and from the second experiment
on the candidate arm does (17 reads against the default's 5). Each sample still runs the real
decode and checks its output, but reports the keys read per step (a work counter, with a
jitter of +-3% drawn from the sample's seed and arm) instead of the clock: the run's one
experiment is IMPROVED (17/3 = 5.7x) and its re-measurement REGRESSED (5/17), whatever the
machine's load (timed by the clock, loaded suite runs read the 17-vs-3 win as low as 1.41x, and
one run's outcome differed from what this test expects)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from paid_endpoint import PaidEndpointStandIn
from support import quick_decode_task, run_cli

from infra_agent.evals.reverify import SEED_OFFSET
from infra_agent.store import open_store
from infra_agent.tasks.patch import Patch

RIGGED = """

# Test equipment (tests/evals/test_eval_outcomes.py): experiment 1 of this task copy measures a
# slow baseline (16 splits), experiments 2 and later a slow candidate; a sample reports the keys
# read per decode step (num_splits + 1, jittered +-3% by seed and arm), not the clock.
import random as _random

_Honest = TaskHarness


class TaskHarness(_Honest):
    def prepare(self, arm):
        if "_nth" not in self.__dict__:  # once per experiment: one harness each
            with open({count!r}, "a") as count:
                count.write("x\\n")
            with open({count!r}) as count:
                self.__dict__["_nth"] = len(count.read().splitlines())
        super().prepare(arm)

    def _knobs(self, arm):
        knobs = super()._knobs(arm)
        slow = "baseline" if self.__dict__.get("_nth", 1) == 1 else "candidate"
        return {{**knobs, "num_splits": 16}} if arm.name == slow else knobs

    def sample(self, arm, seed):
        measured = super().sample(arm, seed)  # the real decode, its output checked
        reads = self._knobs(arm)["num_splits"] + 1
        jitter = _random.Random(f"{{seed}}-{{arm.name}}").uniform(0.97, 1.03)
        return {{**measured, "step_time_ms": reads * jitter}}
"""


def rigged_task(parent: Path, name: str, gain: float) -> Path:
    """A quick decode-split-norm copy named `name` with the rigged harness and a `gain` target."""
    folder = quick_decode_task(parent / f"{name}.copy").rename(parent / name)
    toml = folder / "task.toml"
    text = toml.read_text().replace('name = "decode-split-norm-quick"', f'name = "{name}"')
    toml.write_text(re.sub(r"gain = [\d.]+", f"gain = {gain}", text))
    harness = folder / "harness.py"
    harness.write_text(harness.read_text() + RIGGED.format(count=str(parent / f"{name}.count")))
    return folder


def _script(path: Path) -> Path:
    replies = [
        {"content": "fewer splits", "tool_calls": [{"name": "propose_knobs", "arguments": {
            "knobs": {"num_splits": 2}, "rationale": "each split re-reads the keys"}}]},
        {"content": "verify", "tool_calls": [{"name": "run_experiment", "arguments": {
            "patch_id": "{{last_patch_id}}"}}]},
        {"content": "done", "tool_calls": [{"name": "finish", "arguments": {"summary": "2 splits"}}]},
    ]  # fmt: skip
    path.write_text(json.dumps(replies))
    return path


def _eval(db: Path, *args: str) -> dict[str, Any]:
    done = run_cli("--db", str(db), "eval", *args, "--json", timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _why(db: Path, again: dict[str, Any]) -> str:
    store = open_store(db, readonly=True)
    try:
        record = store.get_experiment(again["experiment_id"])
        return record.result.render() if record else "not stored"
    finally:
        store.close()


@pytest.mark.slow
def test_solved_is_the_tasks_criterion_and_a_win_that_does_not_hold_is_a_claim_disproved(
    tmp_path: Path,
) -> None:
    # 17 key reads a step against 3 (5.7x, counted): a 1.2x target is reached, 50x is not.
    reachable = rigged_task(tmp_path, "rigged-reachable", gain=1.2)
    beyond = rigged_task(tmp_path, "rigged-beyond", gain=50.0)  # no patch here reaches 50x
    db = tmp_path / "runs.db"
    script = _script(tmp_path / "script.json")
    report = _eval(db, "--suite", str(reachable), "--suite", str(beyond), "--policy", "scripted",
                   "--script", str(script))  # fmt: skip
    first, second = report["attempts"]
    for a in (first, second):
        r = a["result"]
        assert a["status"] == "finished" and r["verdicts"] == ["IMPROVED"] and r["improved"]
        assert 5.0 < r["speedups"][0] < 6.5, r  # 17/3 reads, within the jitter
        again = r["reverification"]
        assert again["verdict"] == "REGRESSED", (again, _why(db, again))  # 17 reads against 5
        assert again["disproved"] is True
        assert again["seed"] >= SEED_OFFSET
        # a win that did not hold is set aside: not solved, not the best ratio (issue 33)
        assert [w["why"] for w in r["set_aside"]] == ["not held"] and r["best_speedup"] is None
    assert not first["result"]["solved"] and first["result"]["criteria_met"] == [True]
    assert not second["result"]["solved"] and second["result"]["criteria_met"] == [False]
    cells = {c["task"]: c for c in report["cells"]}
    assert (cells[str(reachable)]["solved"], cells[str(reachable)]["improved"]) == (0, 1)
    assert (cells[str(beyond)]["solved"], cells[str(beyond)]["improved"]) == (0, 1)
    assert cells[str(beyond)]["set_aside"] == {"not held": 1}
    assert (cells["*"]["solved"], cells["*"]["improved"], cells["*"]["disproved"]) == (0, 2, 2)
    store = open_store(db, readonly=True)
    try:
        for a in (first, second):
            again = a["result"]["reverification"]
            record = store.get_experiment(again["experiment_id"])
            assert record is not None and record.run_id is None  # the agent never saw it
            won = store.experiments(a["run_id"])
            assert [e.id for e in won] == [again["of_experiment"]]
            assert record.patch_id == won[0].patch_id == again["patch_id"]
        measured = len(store.experiments())
    finally:
        store.close()
    assert measured == 4  # two runs' experiments and two re-measurements
    table = run_cli("--db", str(db), "eval", "report", report["eval"]["id"], env={"COLUMNS": "300"})
    assert table.returncode == 0 and "disproved" in table.stdout, table.stderr
    assert "set aside, not held: re-measured on fresh seeds: REGRESSED" in table.stdout
    assert re.search(r"rigged-beyond .*0/1 \(1 improved\).*1/1", table.stdout), table.stdout
    page = tmp_path / "report.html"
    written = run_cli("--db", str(db), "eval", "report", report["eval"]["id"], "--html", str(page))
    assert written.returncode == 0, written.stderr
    html = page.read_text()
    assert "<th>improved</th>" in html and "<th>disproved</th>" in html
    assert re.search(r"rigged-beyond</td><td>0/1</td><td>-</td><td>1/1</td><td>1/1</td>", html)

    resumed = _eval(db, "--resume", report["eval"]["id"])  # everything finished: nothing re-run
    assert resumed["attempts"] == report["attempts"]
    store = open_store(db, readonly=True)
    try:
        assert len(store.experiments()) == measured
    finally:
        store.close()

    fresh = rigged_task(tmp_path, "rigged-skip", gain=1.5)  # its experiment 1 again
    skipped = _eval(db, "--suite", str(fresh), "--policy", "scripted", "--script", str(script),
                    "--no-reverify")  # fmt: skip
    (attempt,) = skipped["attempts"]
    assert attempt["result"]["improved"] and attempt["result"]["reverification"] is None
    assert skipped["eval"]["reverify"] is False and skipped["cells"][-1]["reverified"] == 0
    store = open_store(db, readonly=True)
    try:
        assert len(store.experiments()) == measured + 1  # the run's one experiment, no more
    finally:
        store.close()


PROFILES = """
[llm.profiles.glm-a]
base_url = "{url}"
model = "glm-a"

[llm.profiles.glm-b]
base_url = "{url}"
model = "glm-b"
"""


@pytest.mark.slow
def test_several_model_profiles_in_one_eval(tmp_path: Path) -> None:
    """`--model glm-a --model glm-b`: two profiles at the same stand-in endpoint under different
    names; glm-a proves fewer splits, glm-b only looks. Each attempt's requests name its model."""
    task = rigged_task(tmp_path, "rigged-models", gain=1.2)
    endpoint = PaidEndpointStandIn()
    patch = Patch(kind="knobs", knobs={"num_splits": 2}).hash
    knobs = '{"knobs": {"num_splits": 2}, "rationale": "each split re-reads the keys"}'
    endpoint.queue = [
        ("stream", endpoint.tool_call_reply("propose_knobs", knobs)),
        ("stream", endpoint.tool_call_reply("run_experiment", json.dumps({"patch_id": patch}))),
        ("stream", endpoint.tool_call_reply("finish", '{"summary": "2 splits"}')),
        ("stream", endpoint.tool_call_reply("describe_task", "{}")),
        ("stream", endpoint.tool_call_reply("finish", '{"summary": "nothing proven"}')),
    ]
    config = tmp_path / "infra-agent.toml"
    config.write_text(PROFILES.format(url=endpoint.url))
    db = tmp_path / "runs.db"
    try:
        done = run_cli("--config", str(config), "--db", str(db), "eval", "--suite", str(task),
                       "--policy", "llm", "--model", "glm-a", "--model", "glm-b", "--budget", "2",
                       "--json", timeout=900)  # fmt: skip
    finally:
        endpoint.close()
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["eval"]["profiles"] == ["glm-a", "glm-b"]
    assert [b["model"] for b in endpoint.requests] == ["glm-a"] * 3 + ["glm-b"] * 2
    a, b = report["attempts"]
    assert (a["profile"], b["profile"]) == ("glm-a", "glm-b") and a["id"] != b["id"]
    assert not a["result"]["solved"] and a["result"]["criteria_met"] == [True], a["result"]
    assert a["result"]["reverification"]["disproved"], _why(db, a["result"]["reverification"])
    assert not b["result"]["improved"] and b["result"]["experiments"] == 0
    cells = [(c["agent"], c["task"], c["solved"], c["disproved"]) for c in report["cells"]]
    assert cells == [
        ("llm:glm-a", str(task), 0, 1), ("llm:glm-a", "*", 0, 1),
        ("llm:glm-b", str(task), 0, 0), ("llm:glm-b", "*", 0, 0),
    ]  # fmt: skip
    store = open_store(db, readonly=True)
    try:
        assert [store.get_run(x["run_id"]).model for x in (a, b)] == ["glm-a", "glm-b"]  # type: ignore[union-attr]
    finally:
        store.close()
    refused = run_cli("--config", str(config), "--db", str(db), "eval", "--suite", str(task),
                      "--policy", "llm", "--model", "glm-c")  # fmt: skip
    assert refused.returncode != 0 and "no LLM profile 'glm-c'" in refused.stderr
    assert "glm-a" in refused.stderr  # the profiles it knows
