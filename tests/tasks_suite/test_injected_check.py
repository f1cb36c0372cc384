"""`infra-agent tasks check` end to end on one injected-fault task, on the real SGLang server: the
fault's symptom is measured against the un-injected engine, the reference fix is IMPROVED, the
wrong fix is not. (Every injected task, with `diagnose`: benchmarks/check_injected_tasks.py.)"""

from __future__ import annotations

import json

import pytest
from support import sglang_server_marks
from typer.testing import CliRunner

pytestmark = [
    *sglang_server_marks(),  # three experiments, each starting real servers, on 2 cores
    # Three serving experiments (8+ minutes on 2 cores), and its reference fix came out NO_CHANGE
    # once on a loaded machine: a long end-to-end check, not a CI test (as
    # benchmarks/check_injected_tasks.py, which measures every injected task).
    pytest.mark.long,
]
TASK = "sglang-stalled-scheduler"
"""The injected task with the largest effect (its experiments stop earliest)."""


def test_tasks_check_on_an_injected_task() -> None:
    from infra_agent.cli import app

    out = CliRunner().invoke(app, ["tasks", "check", TASK, "--json"])
    doc = json.loads(out.stdout)
    print(json.dumps(doc, indent=1)[:4000])
    rows = {row["question"]: row for row in doc["rows"]}
    assert rows["symptom"]["verdict"] == "IMPROVED", rows["symptom"]
    assert rows["reference"]["verdict"] == "IMPROVED", rows["reference"]
    assert rows["wrong fix"]["verdict"] != "IMPROVED", rows["wrong fix"]
    assert "x (95% CI" in rows["symptom"]["number"]
    assert out.exit_code == 0, out.output
