"""Shared fixtures: every test gets its own run store, so no test touches the user's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("infra-agent-home")
    monkeypatch.setenv("INFRA_AGENT_HOME", str(home))
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "INFRA_AGENT_DB", "INFRA_AGENT_LLM_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    yield home
