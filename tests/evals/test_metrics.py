"""Eval metrics and suites (no runs here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.evals.metrics import cell, pass_at_k, wilson
from infra_agent.evals.suites import load_suites, resolve
from infra_agent.store.evals import AttemptRecord, AttemptResult


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
