"""The CLI as a user meets it: help, --json discipline, one-line errors, nothing written."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_cli

from infra_agent.store import open_store
from infra_agent.store.records import STORE_SCHEMA_VERSION, RunRecord

GROUPS = [
    "optimize",
    "experiment",
    "diagnose",
    "feedback",
    "tasks",
    "runs",
    "review",
    "export",
    "config",
    "tools",
]


def test_every_group_has_help() -> None:
    top = run_cli("--help")
    assert top.returncode == 0
    for group in GROUPS:
        assert group in top.stdout
        result = run_cli(group, "--help")
        assert result.returncode == 0, (group, result.stderr)
        assert "Usage" in result.stdout


def test_runs_list_json_on_empty_store_is_empty_list(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    result = run_cli("--db", str(db), "runs", "list", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []
    assert not db.exists()  # reading never creates a store


def test_runs_list_and_show_read_the_store(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    from infra_agent.sandboxes.host import capture_environment

    run = RunRecord(
        task="decode-split-norm", objective="throughput", policy="search", summary="1.6x",
        environment=capture_environment("local"),
    )  # fmt: skip
    store.put_run(run)
    store.close()
    listed = json.loads(run_cli("--db", str(db), "runs", "list", "--json").stdout)
    assert [r["id"] for r in listed] == [run.id]
    shown = run_cli("--db", str(db), "runs", "show", run.id, "--json")
    assert json.loads(shown.stdout)["run"]["task"] == "decode-split-norm"
    shown_env = json.loads(shown.stdout)["run"]["environment"]
    assert shown_env["sandbox"]["backend"] == "local" and shown_env["packages"]["pydantic"]
    env_line = run_cli("--db", str(db), "runs", "show", run.id).stdout
    assert "ran on: " in env_line and "sandbox local" in env_line
    human = run_cli("--db", str(db), "runs", "list")
    assert run.id in human.stdout
    missing = run_cli("--db", str(db), "runs", "show", "run-nope")
    assert missing.returncode != 0 and "run 'run-nope' not found" in missing.stderr


def test_malformed_config_is_one_line_no_traceback_nothing_written(tmp_path: Path) -> None:
    (tmp_path / "infra-agent.toml").write_text('[store]\ndb = "x.db"\nbogus = 1\n')
    result = run_cli("config", "show", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "field 'store.bogus'" in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "x.db").exists()
    debug = run_cli("--debug", "config", "show", cwd=tmp_path)
    assert "Traceback" in debug.stderr


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    result = run_cli(
        "config", "show", "--json", cwd=tmp_path,
        env={"OPENAI_API_KEY": "sk-live-123456", "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["llm"]["endpoint"]["base_url"] == "http://127.0.0.1:9/v1"
    assert "sk-live-123456" not in result.stdout


def test_newer_schema_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    open_store(db).close()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE meta SET value=? WHERE key='schema_version'", (str(STORE_SCHEMA_VERSION + 5),)
        )
    result = run_cli("--db", str(db), "runs", "list")
    assert result.returncode == 2
    assert "newer than this infra-agent supports" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [["runs", "list", "--bogus"], ["no-such-command"]])
def test_unknown_options_and_commands_fail(args: list[str]) -> None:
    result = run_cli(*args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("columns", "width"), [(None, "160"), ("100", "100")])
def test_output_to_a_log_is_wide_enough_for_the_tables(columns: str | None, width: str) -> None:
    """Piped or logged (an eval under nohup), rich's default 80 columns broke the eval report's
    table into a character a line; a log gets 160, and COLUMNS still rules where it is set."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env |= {"COLUMNS": columns} if columns else {}
    code = "from infra_agent.output import console, err_console; print(console.width, err_console.width)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [width, width]
