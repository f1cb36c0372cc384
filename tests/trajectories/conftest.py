"""Fixtures for the trajectory export tests: a realistic run store with planted secrets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests import the store builder by name

from trajectory_store import ENV_SECRET, SECRET_ENV, Fixture, build_store  # noqa: E402


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The secret env var is set while the store is written and exported."""
    monkeypatch.setenv(SECRET_ENV, ENV_SECRET)


@pytest.fixture
def fx(tmp_path: Path, planted: None) -> Fixture:
    return build_store(tmp_path / "runs.db")
