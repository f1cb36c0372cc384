"""The scrubbed environment and the backend registry (no sandbox started)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.sandboxes import available_backends, create_sandbox
from infra_agent.sandboxes.environment import is_secret, scrubbed_environment


def test_only_allow_listed_non_secret_variables_pass() -> None:
    parent = {
        "OPENAI_API_KEY": "sk-1",
        "AWS_SECRET_ACCESS_KEY": "a",
        "HF_TOKEN": "b",
        "DB_PASSWORD": "c",
        "HTTP_PROXY": "http://proxy",
        "no_proxy": "x",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "2",
        "PATH": "/evil/bin:/usr/bin",
        "HOME": "/root",
        "PYTHONPATH": "/root/harness",
    }
    env = scrubbed_environment(parent, home="/ws", python_bin="/venv/bin", extra={"SEED": "3"})
    assert env["LC_ALL"] == "C.UTF-8" and env["OMP_NUM_THREADS"] == "2" and env["SEED"] == "3"
    assert env["HOME"] == "/ws" and env["TMPDIR"] == "/tmp"
    assert env["PATH"].startswith("/venv/bin:") and "/evil" not in env["PATH"]
    leaked = set(parent) - {"LC_ALL", "OMP_NUM_THREADS", "PATH", "HOME"}
    assert not leaked & set(env)


def test_secret_globs_apply_even_to_allow_listed_names() -> None:
    env = scrubbed_environment({"LC_TOKEN": "t", "LANG": "C"}, home="/ws")
    assert "LC_TOKEN" not in env and env["LANG"] == "C"
    assert is_secret("my_api_key", ["*KEY*"])  # case-insensitive
    assert not is_secret("KEYBOARD_LAYOUT", ["*TOKEN*"])


def test_unknown_backend_and_missing_workspace_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown sandbox backend 'vm'"):
        create_sandbox("vm", tmp_path)
    with pytest.raises(UserError, match="is not a folder"):
        create_sandbox("local", tmp_path / "missing")


def test_available_backends_names_each_backend() -> None:
    backends = available_backends()
    assert set(backends) == {"local", "docker"}
    assert all(reason is None or isinstance(reason, str) for reason in backends.values())


def test_a_read_only_virtual_environment_brings_its_base_interpreter(tmp_path: Path) -> None:
    from infra_agent.sandboxes.confinement import python_paths

    base = tmp_path / "pythons" / "3.12"
    (base / "bin").mkdir(parents=True)
    venv = tmp_path / "sglang-env"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\nversion = 3.12.1\n")
    paths = python_paths([venv, tmp_path / "models"])
    assert base.resolve() in paths
    assert Path(sys.prefix).resolve() in paths and Path(sys.base_prefix).resolve() in paths
