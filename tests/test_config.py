"""Configuration precedence (defaults < file < environment < flags), masking and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra_agent.config import load_settings, masked
from infra_agent.errors import UserError


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "infra-agent.toml"
    cfg.write_text(
        '[llm.endpoint]\nbase_url = "http://file"\nmodel = "from-file"\n[store]\ndb = "/file.db"\n'
    )
    s = load_settings(cwd=tmp_path, env={})
    assert (s.llm.endpoint.base_url, s.llm.endpoint.model, str(s.store.db)) == (
        "http://file", "from-file", "/file.db",
    )  # fmt: skip
    s = load_settings(
        cwd=tmp_path, env={"OPENAI_BASE_URL": "http://env", "INFRA_AGENT_DB": "/env.db"}
    )
    assert s.llm.endpoint.base_url == "http://env" and str(s.store.db) == "/env.db"
    assert s.llm.endpoint.model == "from-file"
    s = load_settings(
        cwd=tmp_path, env={"INFRA_AGENT_DB": "/env.db"}, overrides={"store.db": "/flag.db"}
    )
    assert str(s.store.db) == "/flag.db"


def test_profiles_and_secret_masking(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[llm]\nprofile = "zai"\n[llm.profiles.zai]\nbase_url = "https://api.z.ai/api/paas/v4"\n'
        'api_key = "sk-very-secret-value"\nmodel = "glm-4.6"\n'
    )
    s = load_settings(cfg, env={})
    assert s.llm.active().resolved_key() == "sk-very-secret-value"
    assert s.llm.configured()
    assert "sk-very-secret-value" not in str(masked(s))
    s = load_settings(cfg, env={"OPENAI_API_KEY": "sk-env-secret"})
    assert "sk-env-secret" not in str(masked(s))


def test_unknown_profile_is_a_clear_error(tmp_path: Path) -> None:
    s = load_settings(cwd=tmp_path, env={"INFRA_AGENT_LLM_PROFILE": "nope"})
    with pytest.raises(UserError, match="llm.profile 'nope' is not defined"):
        s.llm.active()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x = [", "not valid TOML"),
        ("[store]\ndb = 3\n", "field 'store.db'"),
        ("[review]\nport = 'eighty'\n", "field 'review.port'"),
        ("[nonsense]\na = 1\n", "field 'nonsense'"),
    ],
)
def test_malformed_config_names_the_field(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(UserError, match=message) as info:
        load_settings(cfg, env={})
    assert str(cfg) in str(info.value) and "\n" not in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        load_settings(tmp_path / "absent.toml", env={})
