"""`infra-agent feedback run NAME --task T`: the agent's instruments run for a person through the
registry's own tool function, printing the text the model reads or the typed record."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import BaseModel
from support import run_cli
from typer.testing import CliRunner

from infra_agent.cli import app
from infra_agent.errors import UserError
from infra_agent.store import open_store
from infra_agent.tasks.registry import find_task
from infra_agent.tools import registry
from infra_agent.tools.base import ToolResult, instrument
from infra_agent.tools.context import ToolContext
from infra_agent.tools.microbench import MicrobenchRecord
from infra_agent.tools.registry import default_registry

TASK = "decode-split-norm"
QUICK = ["--param", "seq_len=256"]
"""A shorter workload: the published setup runs in about a second."""


def _shape(text: str) -> list[str]:
    """A microbench rendering without its measured numbers: the arms line whole, then the
    verdict line and the sampling line with every number and the verdict word masked."""
    lines = text.splitlines()
    masked = [re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", ln) for ln in lines[1:3]]
    masked[0] = re.sub(r"^(FASTER|SLOWER|SAME|AMBIGUOUS):", "VERDICT:", masked[0])
    masked[1] = re.sub(r"stopped on \w+", "stopped on REASON", masked[1])
    return [lines[0], *masked]


def test_the_cli_prints_what_the_model_reads_and_json_is_the_typed_record(
    tmp_path: Path,
) -> None:
    """One real microbench three ways on the published workload: through the registry as the
    model calls it, `feedback run` as text, and `feedback run --patch --json`."""
    ctx = ToolContext(task=find_task(TASK), store=open_store(tmp_path / "r.db"), run_id="r")
    ctx.params = {"seq_len": 256}
    direct = default_registry("dense", ctx.task).call(
        "microbench", json.dumps({"seconds": 0.5, "clock": "cpu"}), ctx
    )
    assert direct.error is None, direct.error
    shown = run_cli("feedback", "run", "microbench", "--task", TASK, *QUICK, "seconds=0.5",
                    "clock=cpu", timeout=300)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert _shape(shown.stdout) == _shape(direct.content)  # then a noise line, or not
    assert shown.stdout.startswith("microbench on the experiment's workload")

    reference = ctx.task.root / "reference.patch"
    as_json = run_cli("feedback", "run", "microbench", "--task", TASK, *QUICK, "--json",
                      "--patch", str(reference), "--params", '{"seconds": 0.5, "clock": "cpu"}',
                      timeout=300)  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    record = MicrobenchRecord.model_validate(json.loads(as_json.stdout))
    assert record.arms.patch_id is not None and len(record.arms.patch_id) == 64
    assert record.arms.baseline == record.arms.candidate  # same call, patched workspace
    assert record.comparison.n_candidate > 0 and record.timer == "sandbox:thread_time_ns"
    assert "candidate with patch" in record.render().splitlines()[0]


def test_bad_input_is_one_line_and_a_non_zero_exit() -> None:
    unknown = run_cli("feedback", "run", "nope", "--task", TASK)
    assert unknown.returncode != 0 and unknown.stderr.count("\n") == 1
    assert unknown.stderr.startswith("error: unknown instrument 'nope'; instruments: ")
    for name in ("microbench", "accuracy_diff", "profile", "gil_trace", "server_steps"):
        assert name in unknown.stderr
    assert "read_file" not in unknown.stderr  # a tool, not an instrument
    bad = run_cli("feedback", "run", "microbench", "--task", TASK, "seconds=lots")
    assert bad.returncode != 0 and bad.stderr.count("\n") == 1
    assert "'seconds'" in bad.stderr and "do not match its schema" in bad.stderr
    extra = run_cli("feedback", "run", "profile", "--task", TASK, "cod=f(x)")
    assert extra.returncode != 0 and extra.stderr.count("\n") == 1
    assert "profile has no parameter 'cod' (parameters: setup, code," in extra.stderr
    wrong_task = run_cli("feedback", "run", "server_steps", "--task", TASK)
    assert wrong_task.returncode != 0 and "does not work for task" in wrong_task.stderr


class Echo(BaseModel):
    text: str | None = None
    n: int = 1
    patch_id: str | None = None


class EchoRecord(BaseModel):
    text: str | None
    n: int
    patch_files: list[str]

    def render(self) -> str:
        return f"echo {self.text!r} x{self.n}; patch files: {', '.join(self.patch_files) or '-'}"


@instrument("echo", "Repeat the arguments (test equipment).", Echo)
def echo(p: Echo, ctx: ToolContext) -> ToolResult:
    files = list(ctx.patch(p.patch_id).files) if p.patch_id else []
    return ToolResult.of(EchoRecord(text=p.text, n=p.n, patch_files=files))


def test_a_new_instrument_is_one_registration_away_from_the_cli(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An `@instrument` added to the registry's list runs from `feedback run` at once, text and
    record as the registry call gives them; text parameters stay text, others are JSON."""
    monkeypatch.setattr(registry, "AGENT_TOOLS", [*registry.AGENT_TOOLS, echo])
    runner = CliRunner()
    base = ["feedback", "run", "echo", "--task", TASK]
    text = runner.invoke(app, [*base, "text=1", "n=3"], catch_exceptions=False)
    assert text.exit_code == 0, text.output
    ctx = ToolContext(task=find_task(TASK), store=open_store(tmp_path / "r.db"), run_id="r")
    direct = default_registry("dense", ctx.task).call("echo", '{"text": "1", "n": 3}', ctx)
    assert text.stdout == direct.content + "\n" == "echo '1' x3; patch files: -\n"

    patch = ctx.task.root / "reference.patch"
    doc = runner.invoke(app, [*base, "--json", "--patch", str(patch), "--params", '{"n": 2}'])
    assert doc.exit_code == 0, doc.output
    assert json.loads(doc.stdout) == {"text": None, "n": 2, "patch_files": ["attention.py"]}

    db = tmp_path / "runs.db"
    stored = runner.invoke(app, ["--db", str(db), *base, "text=kept"], catch_exceptions=False)
    assert stored.exit_code == 0, stored.output
    kept = open_store(db).feedback()
    assert [(f.instrument, f.record["text"]) for f in kept] == [("echo", "kept")]
    assert kept[0].rendering == "echo 'kept' x1; patch files: -"

    both = runner.invoke(app, [*base, "--patch", str(patch), "patch_id=abc"])
    assert isinstance(both.exception, UserError) and "not both" in str(both.exception)
    not_json = runner.invoke(app, [*base, "--params", "[1]"])
    assert isinstance(not_json.exception, UserError)
    assert "--params must be a JSON object" in str(not_json.exception)
    tool_only = runner.invoke(app, ["feedback", "run", "read_file", "--task", TASK])
    assert isinstance(tool_only.exception, UserError)
    assert "unknown instrument 'read_file'" in str(tool_only.exception)


def test_the_two_arm_instruments_share_one_parameter_base() -> None:
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in
               default_registry().schemas()}  # fmt: skip
    bench, accuracy = schemas["microbench"]["properties"], schemas["accuracy_diff"]["properties"]
    for name in ("setup", "baseline", "candidate", "patch_id"):
        assert bench[name] == accuracy[name]
    assert "seconds" in bench and "reference" in accuracy
    kinds = {t.name: t.kind for t in registry.AGENT_TOOLS}
    assert {n for n, k in kinds.items() if k == "instrument"} >= {
        "microbench", "accuracy_diff", "profile", "gil_trace", "serving_workload", "server_steps"
    }  # fmt: skip
    assert kinds["read_file"] == "tool" and kinds["run_experiment"] == "tool"


@pytest.mark.parametrize(
    ("verdict", "low", "high", "noted"),
    [
        ("FASTER", 1.005, 1.040, True),  # the A/A-sized win measured on identical code
        ("FASTER", 1.030, 1.090, False),  # low end above 1 + min_effect/2
        ("SLOWER", 0.960, 0.990, True),
        ("SLOWER", 0.900, 0.960, False),
        ("AMBIGUOUS", 0.990, 1.040, False),
    ],
)
def test_microbench_says_when_a_difference_is_below_the_tasks_minimum_effect(
    verdict: str, low: float, high: float, noted: bool
) -> None:
    from infra_agent.judgement import Comparison
    from infra_agent.tools.sandboxed import Arms

    comparison = Comparison(
        speedup=(low + high) / 2, ci_low=low, ci_high=high, verdict=verdict, confidence=0.95,
        baseline_median=1e-3, candidate_median=1e-3, n_baseline=20, n_candidate=20,
    )  # fmt: skip
    record = MicrobenchRecord(
        comparison=comparison, iterations_per_sample=10, timer="sandbox:perf_counter_ns",
        rounds=20, elapsed_s=3.0, stopped="ci_width", ci_width_target=0.05,
        arms=Arms(setup="", baseline="f()", candidate="f()"), min_effect=0.05,
    )  # fmt: skip
    assert ("smaller than the task's minimum effect (5%)" in record.render()) is noted
