"""`infra-agent export`: every format written, validated, redacted, round-tripped; filters; atomicity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trajectory_store import BAD_ARGS, SECRETS, Fixture
from typer.testing import CliRunner

from infra_agent.cli import app
from infra_agent.errors import UserError
from infra_agent.store import open_store
from infra_agent.trajectories import export as export_module
from infra_agent.trajectories.arrow import read_rows
from infra_agent.trajectories.atif import Trajectory
from infra_agent.trajectories.export import ExportFilter, export_dataset
from infra_agent.trajectories.formats import ExportFormat, RlRow, SftRow

FORMATS = [(fmt, parquet) for fmt in ExportFormat for parquet in (False, True)]


def check_round_trip(
    fx: Fixture, fmt: ExportFormat, rows: list[dict[str, Any]], reference: Trajectory
) -> None:
    """Step count, tool calls, verdicts and rewards of run A survive the format."""
    verdicts = [v.value for v in fx.a_verdicts]
    if fmt is ExportFormat.ATIF:
        t = Trajectory.model_validate(next(r for r in rows if r["session_id"] == fx.run_a))
        assert t == reference
        return
    model = SftRow if fmt is ExportFormat.OPENAI_SFT else RlRow
    parsed = [model.model_validate(r) for r in rows]
    if isinstance(parsed[0], SftRow):
        row = next(r for r in parsed if isinstance(r, SftRow) and r.metadata.session_id == fx.run_a)
        messages = row.messages
        assert (
            row.metadata.verdicts == verdicts
            and row.metadata.reward == reference.extra.reward.total
        )
    else:
        rl = next(r for r in parsed if isinstance(r, RlRow) and r.session_id == fx.run_a)
        messages = rl.prompt + rl.completion
        assert [m.role for m in rl.prompt] == ["system", "user"] and rl.completion[
            0
        ].role == "assistant"
        assert rl.verdicts == verdicts
        assert rl.reward == reference.extra.reward.total
        assert rl.reward_components == reference.extra.reward.components
        assert rl.metrics.best_speedup == 1.62 and rl.metrics.n_messages == fx.a_visible
        assert sorted(p.reward for p in rl.proposals) == sorted(
            p.reward.total for p in reference.extra.proposals
        )
    assert len(messages) == fx.a_visible  # the harness note never reached the model
    assert "decision: continue" not in json.dumps([m.model_dump() for m in messages])
    calls = [c for m in messages for c in (m.tool_calls or [])]
    assert [c.id for c in calls] == ["call_1", "call_2", "call_3", "call_4"]
    assert json.loads(calls[0].function.arguments) == {"target": "decode", "seconds": 5}
    assert calls[1].function.arguments == BAD_ARGS  # the model's invalid text, verbatim
    assert json.loads(calls[3].function.arguments)["db_password"] == "[REDACTED]"
    tool_ids = [m.tool_call_id for m in messages if m.role == "tool"]
    assert tool_ids == ["call_1", "call_2", "call_3", "call_4"]


def _reference(fx: Fixture) -> Trajectory:
    from infra_agent.redact import Redactor
    from infra_agent.trajectories.build import build_trajectory, load_run

    store = open_store(fx.db, readonly=True)
    run = store.get_run(fx.run_a)
    assert run is not None
    built = build_trajectory(load_run(store, run)).model_dump(mode="json")
    return Trajectory.model_validate(Redactor.from_environment().tree(built))


@pytest.mark.parametrize(
    "fmt, parquet", FORMATS, ids=[f"{f.value}-{'parquet' if p else 'jsonl'}" for f, p in FORMATS]
)
def test_each_format_round_trips_and_leaks_no_secret(fx: Fixture, tmp_path: Path, fmt: ExportFormat, parquet: bool) -> None:  # fmt: skip
    out = tmp_path / "out" / f"data.{'parquet' if parquet else 'jsonl'}"
    summary = export_dataset(open_store(fx.db, readonly=True), fmt, out, parquet=parquet)
    expected_rows = 3 if fmt is ExportFormat.ATIF else 2  # run C has no conversation
    assert summary.rows == expected_rows and out.is_file()
    rows = read_rows(out)
    assert len(rows) == expected_rows
    check_round_trip(fx, fmt, rows, _reference(fx))
    # No secret in the file's bytes, nor in its decoded values (Parquet pages are compressed).
    data = out.read_bytes()
    decoded = json.dumps(rows, ensure_ascii=False).encode()
    for secret in SECRETS:
        assert secret.encode() not in data and secret.encode() not in decoded, secret
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left


def test_output_is_deterministic(fx: Fixture, tmp_path: Path) -> None:
    store = open_store(fx.db, readonly=True)
    for fmt, parquet in FORMATS:
        a, b = tmp_path / f"{fmt.value}-{parquet}-a", tmp_path / f"{fmt.value}-{parquet}-b"
        export_dataset(store, fmt, a, parquet=parquet)
        export_dataset(store, fmt, b, parquet=parquet)
        assert a.read_bytes() == b.read_bytes(), (fmt, parquet)
    sessions = [
        json.loads(line)["session_id"]
        for line in (tmp_path / "atif-False-a").read_text().splitlines()
    ]
    assert sessions == [fx.run_a, fx.run_b, fx.run_c]  # creation order


@pytest.mark.slow
def test_worker_processes_write_the_same_bytes(fx: Fixture, tmp_path: Path) -> None:
    store = open_store(fx.db, readonly=True)
    for fmt, parquet in [(ExportFormat.RL, True), (ExportFormat.ATIF, False)]:
        one, two = tmp_path / f"{fmt.value}-1", tmp_path / f"{fmt.value}-2"
        export_dataset(store, fmt, one, parquet=parquet)
        summary = export_dataset(store, fmt, two, parquet=parquet, jobs=2)
        assert one.read_bytes() == two.read_bytes(), fmt
        assert summary.runs_in_store == 3 and summary.skipped == (
            {"no steps recorded": 1} if fmt is ExportFormat.RL else {}
        )
    with pytest.raises(UserError, match="nothing to export: 0 of 3"):
        export_dataset(
            store, ExportFormat.RL, tmp_path / "none", flt=ExportFilter(tasks=["x"]), jobs=2
        )


def _export_cli(fx: Fixture, out: Path, *args: str) -> Any:
    return CliRunner().invoke(
        app, ["--db", str(fx.db), "export", "--out", str(out), *args, "--json"]
    )


def _sessions(out: Path) -> list[str]:
    return [json.loads(line)["session_id"] for line in out.read_text().splitlines()]


def test_cli_filters(fx: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    cases: list[tuple[list[str], list[str]]] = [
        (["--task", "sglang-cpu-tiny"], [fx.run_b]),
        (["--since", "2026-11-21"], [fx.run_b, fx.run_c]),
        (["--until", "2026-11-21"], [fx.run_a, fx.run_b]),  # a bare date includes that whole day
        (["--verdict", "rejected"], [fx.run_a]),
        (["--verdict", "FAILED", "--verdict", "NO_CHANGE"], [fx.run_b, fx.run_c]),
        (["--reviewed-only"], [fx.run_a]),
        (["--min-reward", "-0.05"], [fx.run_b]),  # C: one FAILED costs 0.1
        (["--run", fx.run_c], [fx.run_c]),
    ]
    for args, expected in cases:
        result = _export_cli(fx, out, "--format", "atif", *args)
        assert result.exit_code == 0, (args, result.output, result.exception)
        assert _sessions(out) == expected, args
        summary = json.loads(result.stdout)
        assert summary["rows"] == len(expected) and summary["runs_in_store"] == 3


def test_cli_weights_change_rewards_and_min_reward(fx: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "rl.jsonl"
    assert _export_cli(fx, out, "--format", "rl").exit_code == 0
    default = {r["session_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    result = _export_cli(
        fx, out, "--format", "rl", "--weight", "rule_violation=0", "--weight", "suspicious=0"
    )
    assert result.exit_code == 0
    light = {r["session_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    a_default, a_light = default[fx.run_a], light[fx.run_a]
    assert a_light["reward_components"] == a_default["reward_components"]
    assert a_light["reward"] == pytest.approx(a_default["reward"] + 3.0)
    assert a_light["reward_weights"]["rule_violation"] == 0.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--format", "csv"], "--format 'csv'"),
        (["--format", "rl", "--verdict", "GREAT"], "--verdict 'GREAT'"),
        (["--format", "rl", "--since", "yesterday"], "--since 'yesterday'"),
        (["--format", "rl", "--weight", "speed=2"], "reward weight 'speed=2'"),
        (["--format", "rl", "--task", "no-such-task"], "nothing to export: 0 of 3 runs"),
    ],
)
def test_cli_bad_input_is_one_line_and_writes_nothing(fx: Fixture, tmp_path: Path, args: list[str], message: str) -> None:  # fmt: skip
    out = tmp_path / "exports" / "never.jsonl"
    result = _export_cli(fx, out, *args)
    assert isinstance(result.exception, UserError) and message in str(result.exception)
    assert "\n" not in str(result.exception)
    assert not out.parent.exists()


def test_missing_store_is_a_user_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["--db", str(tmp_path / "none.db"), "export", "-f", "atif", "-o", str(tmp_path / "x")]
    )
    assert isinstance(result.exception, UserError) and "no run store" in str(result.exception)
    assert not (tmp_path / "none.db").exists()


@pytest.mark.parametrize("parquet", [False, True])
@pytest.mark.parametrize("error", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_failure_midway_leaves_previous_output_and_no_temp_file(
    fx: Fixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parquet: bool,
    error: BaseException,
) -> None:
    (tmp_path / "exports").mkdir()
    out = tmp_path / "exports" / "data"
    out.write_text("previous export\n")
    real_write = export_module._write_batch
    calls = {"n": 0}

    def failing_write(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # the first batch was already written to the temporary file
            raise error
        return real_write(*args)

    monkeypatch.setattr(export_module, "_write_batch", failing_write)
    with pytest.raises(type(error)):
        export_dataset(
            open_store(fx.db, readonly=True), ExportFormat.RL, out, parquet=parquet, batch_rows=1
        )
    assert calls["n"] == 2
    assert out.read_text() == "previous export\n"
    assert [p.name for p in out.parent.iterdir()] == ["data"]


@pytest.mark.parametrize("parquet", [False, True])
def test_invalid_row_is_refused_before_writing(
    fx: Fixture, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parquet: bool
) -> None:
    from infra_agent.trajectories import formats

    real = formats.chat_messages

    def robot_messages(t: Trajectory) -> Any:
        messages = real(t)
        messages[0]["role"] = "robot"
        return messages

    monkeypatch.setattr(formats, "chat_messages", robot_messages)
    out = tmp_path / "exports" / "sft"
    with pytest.raises(ValueError, match="robot"):
        export_dataset(
            open_store(fx.db, readonly=True), ExportFormat.OPENAI_SFT, out, parquet=parquet
        )
    assert not out.exists() and (not out.parent.exists() or list(out.parent.iterdir()) == [])


@pytest.mark.parametrize(
    "fmt, column, bad",
    [
        (ExportFormat.RL, "reward", None),
        (ExportFormat.ATIF, "schema_version", "ATIF-v9"),
    ],
)
def test_column_checks_catch_nulls_and_bad_values(
    fmt: ExportFormat, column: str, bad: Any, fx: Fixture
) -> None:
    from infra_agent.trajectories.arrow import to_table
    from infra_agent.trajectories.build import build_trajectory, load_run
    from infra_agent.trajectories.formats import FORMATS
    from infra_agent.trajectories.writers import check_table

    store = open_store(fx.db, readonly=True)
    run = store.get_run(fx.run_a)
    assert run is not None
    form = FORMATS[fmt]
    row = form.row(build_trajectory(load_run(store, run)))
    check_table(fmt, to_table([row], form.schema))  # the real row passes
    with pytest.raises(ValueError, match=column):
        check_table(fmt, to_table([row | {column: bad}], form.schema))


def test_out_is_a_directory(fx: Fixture, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is a directory"):
        export_dataset(open_store(fx.db, readonly=True), ExportFormat.ATIF, tmp_path)


def test_filter_object_api(fx: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "a.jsonl"
    flt = ExportFilter(tasks=["decode-split-norm"], reviewed_only=True)
    summary = export_dataset(
        open_store(fx.db, readonly=True), ExportFormat.OPENAI_SFT, out, flt=flt
    )
    assert summary.rows == 1 and summary.runs_matched == 1
    assert summary.verdict_counts.REJECTED == 1
    assert "1 rows of openai-sft (jsonl)" in summary.render()


def test_entry_point_prints_one_line_and_exits_non_zero(fx: Fixture, tmp_path: Path) -> None:
    from support import run_cli

    out = tmp_path / "exports" / "x.jsonl"
    bad = run_cli(
        "--db", str(fx.db), "export", "--format", "rl", "--out", str(out), "--min-reward", "100"
    )
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "error: nothing to export: 0 of 3 runs in the store match the filters"
    ]
    assert not out.parent.exists()
    good = run_cli("--db", str(fx.db), "export", "-f", "rl", "-o", str(out), "--json")
    assert good.returncode == 0, good.stderr
    summary = json.loads(good.stdout)
    assert summary["rows"] == 2 and summary["skipped"] == {"no steps recorded": 1}
    assert len(out.read_text().splitlines()) == 2


def test_strict_openai_rows_carry_only_keys_openai_accepts(fx: Fixture, tmp_path: Path) -> None:
    out = tmp_path / "openai.jsonl"
    result = _export_cli(fx, out, "--format", "openai-sft", "--strict-openai")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [sorted(r) for r in rows] == [["messages", "tools"]] * 2
    keys = {k for r in rows for m in r["messages"] for k in m}
    assert keys <= {"role", "content", "tool_calls", "tool_call_id"}
    assert len(rows[0]["messages"]) == fx.a_visible
    bad = _export_cli(fx, tmp_path / "x.parquet", "--format", "rl", "--strict-openai")
    assert isinstance(bad.exception, UserError) and "--strict-openai" in str(bad.exception)
