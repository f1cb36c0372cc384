"""No secret at rest: a run given planted secrets (a secret environment value, an API key in a
model message, an `api_key=` URL and a password in tool arguments, a bearer header echoed in a
tool error) leaves none of them in any file under the data folder: run store, checkpoints (while
the run can be resumed, and after it finished and they were pruned), SQLite side files, exports.
Every file there is private (0600, folders 0700)."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
import sys
from pathlib import Path

import pytest

from infra_agent.agent.configuration import RunConfig
from infra_agent.agent.runner import checkpoint_path, resume_run, start_run
from infra_agent.agent.state import Budget
from infra_agent.config import load_settings
from infra_agent.errors import UserError
from infra_agent.store import open_store

ENV_SECRET = "env-" + secrets.token_hex(12)
MODEL_KEY = "sk-proj-" + secrets.token_hex(12)
URL_KEY = "urlkey" + secrets.token_hex(8)
PASSWORD = "pw-" + secrets.token_hex(8)
BEARER = "Tok" + secrets.token_hex(10)
PLANTED = [ENV_SECRET, MODEL_KEY, URL_KEY, PASSWORD, BEARER]


class Crash(Exception):
    """Stands for the process dying mid-run (the run stays resumable)."""


def script() -> list[dict[str, object]]:
    return [
        {
            "reasoning_content": f"The deployment's key is {ENV_SECRET}; I must not repeat it.",
            "content": f"I found an old key {MODEL_KEY} in the notes.",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": f"notes.txt?api_key={URL_KEY}"}}
            ],
        },
        {
            "content": "Try the header file and the kernel.",
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": f"Authorization: Bearer {BEARER}"}},
                {"name": "read_file", "arguments": {"path": "attention.py", "password": PASSWORD}},
                {"name": "search_files", "arguments": {"regex": f"({ENV_SECRET}"}},
            ],
        },
        {"content": "Nothing to change.", "tool_calls": [{"name": "finish", "arguments": {}}]},
    ]


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def assert_no_secret_and_private(home: Path) -> None:
    found = []
    for path in files_under(home):
        data = path.read_bytes()
        found += [f"{path.name}: {s}" for s in PLANTED if s.encode() in data]
    assert found == []
    for path in [home, *home.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
        if path.suffix in (".db", ".sqlite") or path.name.endswith(("-wal", "-shm")):
            assert mode == 0o600, f"{path} is {oct(mode)}"


@pytest.mark.slow
def test_planted_secrets_never_reach_a_file(
    quick_task: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    home = tmp_path / "home"  # created by the product: a private data folder
    monkeypatch.setenv("INFRA_AGENT_HOME", str(home))
    monkeypatch.setenv("INFRA_AGENT_TEST_API_KEY", ENV_SECRET)
    monkeypatch.chdir(tmp_path)
    old_umask = os.umask(0)  # the loosest umask: files are private only if the product says so
    request.addfinalizer(lambda: os.umask(old_umask))
    (tmp_path / "script.json").write_text(json.dumps(script()))
    settings = load_settings()
    config = RunConfig(
        task=str(quick_task), policy="scripted", script=str(tmp_path / "script.json"),
        budget=Budget(experiments=1, turns=6),
    )  # fmt: skip
    started: list[str] = []

    def crash_after_second_reply(values: dict[str, object]) -> None:
        messages = values.get("messages") or []
        assistant = [m for m in messages if getattr(m, "role", "") == "assistant"]
        if values.get("phase") == "tools" and len(assistant) == 2:
            raise Crash("the machine went down")

    with pytest.raises(Crash):
        start_run(
            config, settings, on_run=lambda run: started.append(run.id),
            on_state=crash_after_second_reply,
        )  # fmt: skip
    [run_id] = started
    db = home / "runs.db"
    store = open_store(db)
    steps = store.steps(run_id)
    store.close()
    # The secrets reached the run (in messages, arguments and tool errors) and were redacted.
    assert any("[REDACTED]" in (s.reasoning_content or "") for s in steps)
    assert any("[REDACTED]" in c.arguments for s in steps for c in s.tool_calls)
    assert any(s.error and "[REDACTED]" in s.error for s in steps if s.role == "tool")
    with sqlite3.connect(checkpoint_path(db)) as conn:  # resumable: its checkpoints are kept
        assert (
            conn.execute(
                "SELECT count(*) FROM checkpoints WHERE thread_id=?", (run_id,)
            ).fetchone()[0]
            > 0
        )
        blobs = b"".join(r[0] for r in conn.execute("SELECT checkpoint FROM checkpoints"))
    assert b"[REDACTED]" in blobs
    assert_no_secret_and_private(home)

    outcome = resume_run(run_id, settings)  # continues where it stopped, and finishes
    assert outcome.status == "finished", outcome
    with sqlite3.connect(checkpoint_path(db)) as conn:  # finished: the run store keeps it
        for table in ("checkpoints", "writes"):
            assert (
                conn.execute(
                    f"SELECT count(*) FROM {table} WHERE thread_id=?", (run_id,)
                ).fetchone()[0]
                == 0
            )

    with pytest.raises(UserError, match="already finished"):  # pruned, and still says why
        resume_run(run_id, settings)

    out = home / "exports" / "sft.jsonl"
    monkeypatch.setattr(
        sys, "argv", ["infra-agent", "export", "--format", "openai-sft", "--out", str(out)]
    )
    from infra_agent.cli import main

    main()
    assert out.stat().st_size > 0
    assert_no_secret_and_private(home)
