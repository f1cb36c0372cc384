"""Eval metrics and suites (no runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.evals.metrics import cell, pass_at_k, summarize, wilson
from infra_agent.evals.records import AttemptRecord, AttemptResult, EvalRecord, Reverification
from infra_agent.evals.report import render_terminal, rows
from infra_agent.evals.suites import load_suites, resolve


def test_pass_at_k_and_wilson() -> None:
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    lo, hi = wilson(1, 2)
    assert 0.0 < lo < 0.5 < hi < 1.0


def test_a_cell_counts_fast_p_over_every_attempt() -> None:
    def attempt(i: int, best: float | None) -> AttemptRecord:
        result = AttemptResult(solved=best is not None, best_speedup=best, tools=["finish"])
        return AttemptRecord(id=f"e/t/{i}", eval_id="e", task="t", index=i, status="finished", result=result)  # fmt: skip

    c = cell("search", "dense", "t", [attempt(0, 1.3), attempt(1, None), attempt(2, 2.5)], 3)
    assert c.solved == 2 and c.fast_p == {"1": 2 / 3, "1.2": 2 / 3, "1.5": 1 / 3, "2": 1 / 3}
    assert c.pass_at_k["1"] == pytest.approx(2 / 3) and c.pass_at_k["3"] == 1.0
    assert c.best_speedup == 2.5


def test_suites_expand_and_bad_ones_are_named(tmp_path: Path) -> None:
    suites = load_suites()
    assert "decode-split-norm" in suites["seed"] and set(suites["seed"]) <= set(suites["all"])
    assert "sglang-cpu-tiny" in suites["all"]
    label, tasks = resolve(["seed"])
    assert label == "seed" and tasks == suites["seed"]
    with pytest.raises(UserError, match="no-such-task"):
        resolve(["no-such-task"])
    bad = tmp_path / "s.toml"
    bad.write_text('[suites.a]\ntasks = ["@a"]\n')
    with pytest.raises(UserError, match="includes itself"):
        load_suites(bad)
    bad.write_text("[suites.a]\ntasks = 3\n")
    with pytest.raises(UserError, match="needs tasks"):
        load_suites(bad)


def _again(disproved: bool) -> Reverification:
    return Reverification(experiment_id="exp_2", of_experiment="exp_1", patch_id="p", seed=1_000_001,
                          verdict="NO_CHANGE" if disproved else "IMPROVED", disproved=disproved)  # fmt: skip


def test_solved_improved_and_claims_disproved_are_counted_apart() -> None:
    results = [
        AttemptResult(solved=True, improved=True, best_speedup=2.0, reverification=_again(False)),
        AttemptResult(solved=False, improved=True, best_speedup=1.2, reverification=_again(True)),
        AttemptResult(solved=False, improved=False),
        AttemptResult(solved=True, best_speedup=1.5),  # a record from before `improved`
    ]
    attempts = [
        AttemptRecord(id=f"e/t/{i}", eval_id="e", task="t", index=i, status="finished", result=r)
        for i, r in enumerate(results)
    ]
    c = cell("llm:a", "dense", "t", attempts, 4)
    assert (c.solved, c.improved, c.reverified, c.disproved) == (2, 3, 2, 1)
    assert c.pass_at_k["1"] == pytest.approx(0.5)  # pass@k counts solved, not improved
    assert c.fast_p["1.2"] == 2 / 4 and c.speedups == [2.0, 1.2, 1.5]  # proven ratios, any target


def test_several_profiles_in_one_eval_get_their_own_rows() -> None:
    record = EvalRecord(suite="s", tasks=["t1", "t2"], policy="llm", profiles=["a", "b"])
    attempts = []
    for profile, won in (("a", True), ("b", False)):
        for task in record.tasks:
            result = AttemptResult(solved=won, improved=True, best_speedup=1.6)
            attempts.append(AttemptRecord(id=AttemptRecord.make_id(record.id, task, 0, profile),
                                          eval_id=record.id, task=task, index=0, profile=profile,
                                          status="finished", result=result))  # fmt: skip
    assert len({a.id for a in attempts}) == 4
    summary = summarize(record, attempts)
    assert [(c.agent, c.task, c.solved) for c in summary.cells] == [
        ("llm:a", "t1", 1), ("llm:a", "t2", 1), ("llm:a", "*", 2),
        ("llm:b", "t1", 0), ("llm:b", "t2", 0), ("llm:b", "*", 0),
    ]  # fmt: skip
    table = rows([summary])
    assert table[3]["solved"] == "0/1" and table[3]["improved"] == "1/1"
    assert table[0]["disproved"] == "-"  # nothing re-measured
    from rich.console import Console

    console = Console(record=True, width=250)
    render_terminal([summary], console)
    text = console.export_text()
    assert "agent" in text and "llm:b" in text and "(1 improved)" in text


def test_not_applicable_attempts_are_left_out_of_the_shares() -> None:
    """A search policy on a task without knobs is not applicable: it is not an unsolved attempt
    (the seed suite's eval showed 1/14 solved, CI 0.01-0.31, where 1 of 2 applicable solved)."""
    won = AttemptResult(solved=True, improved=True, best_speedup=1.66, tools=["finish"])
    attempts = [
        AttemptRecord(id="e/a/0", eval_id="e", task="a", index=0, status="finished", result=won),
        AttemptRecord(id="e/a/1", eval_id="e", task="a", index=1, status="finished",
                      result=AttemptResult(solved=False, improved=False, tools=["finish"])),
        *(AttemptRecord(id=f"e/b/{i}", eval_id="e", task="b", index=i, status="not_applicable",
                        reason="task b has no knobs") for i in range(2)),
    ]  # fmt: skip
    record = EvalRecord(suite="s", tasks=["a", "b"], policy="search", feedback="dense", attempts=2)
    summary = summarize(record, attempts)
    a, b, suite = summary.cells
    assert (b.applicable, b.not_applicable, b.pass_at_k) == (0, 2, {})
    assert suite.applicable == 2 and suite.solve_rate == 0.5 and suite.fast_p["1.5"] == 0.5
    assert suite.solve_ci == wilson(1, 2) and suite.pass_at_k == a.pass_at_k == {"1": 0.5, "2": 1.0}
    table = {r["task"]: r for r in rows([summary])}
    assert table["b"]["solved"] == "n/a" and table["b"]["solve 95% CI"] == "-"
    assert table["all tasks"]["solved"] == "1/2 (2 n/a)"
    from rich.console import Console

    console = Console(record=True, width=100)
    render_terminal([summary], console)
    text = console.export_text()
    assert text.count("task b has no knobs") == 1, text  # one line per task, not per attempt


def test_several_evals_side_by_side_per_task_with_what_they_spent() -> None:
    """One eval per task and arm (the relay attempts) read as one table: per task, dense beside
    sparse, solved and the medians of replies, experiments, tokens and wall time."""
    from rich.console import Console

    from infra_agent.evals.report import render_side_by_side, spent_rows

    def one(feedback: str, task: str, solved: bool, turns: int, tokens: int) -> object:
        record = EvalRecord(suite=task, tasks=[task], policy="llm", feedback=feedback, attempts=1)
        result = AttemptResult(solved=solved, improved=solved, best_speedup=2.0 if solved else None,
                               turns=turns, experiments=1, tokens=tokens, wall_s=100.0)  # fmt: skip
        attempt = AttemptRecord(id=f"{record.id}/{task}/0", eval_id=record.id, task=task, index=0,
                                status="finished", result=result)  # fmt: skip
        return summarize(record, [attempt])

    summaries = [one("sparse", "b", False, 17, 190_000), one("dense", "b", True, 8, 36_000),
                 one("dense", "a", True, 9, 50_000)]  # fmt: skip
    table = spent_rows(summaries)  # type: ignore[arg-type]
    assert [(r["task"], r["feedback"], r["solved"], r["replies"], r["tokens"]) for r in table] == [
        ("a", "dense", "1/1", "9", "50,000"),
        ("b", "dense", "1/1", "8", "36,000"),
        ("b", "sparse", "0/1", "17", "190,000"),
    ]
    console = Console(record=True, width=200)
    render_side_by_side(summaries, console)  # type: ignore[arg-type]
    text = console.export_text()
    assert "3 evals side by side" in text and "190,000" in text
