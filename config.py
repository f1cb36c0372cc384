"""Configuration: defaults < `infra-agent.toml` (or `--config`) < environment < command-line flags.

The LLM endpoint follows the ecosystem's conventions (`OPENAI_BASE_URL`, `OPENAI_API_KEY`), with
named profiles in the TOML file (e.g. Z.ai's GLM API, a self-hosted SGLang endpoint).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import platformdirs
import tomllib
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from infra_agent.errors import UserError

CONFIG_FILENAME = "infra-agent.toml"


def default_data_dir() -> Path:
    """Where the run store and caches live unless configured (`INFRA_AGENT_HOME` overrides)."""
    home = os.environ.get("INFRA_AGENT_HOME")
    return Path(home) if home else Path(platformdirs.user_data_dir("infra-agent"))


class LLMProfile(BaseModel):
    """An OpenAI-compatible chat endpoint, and the dialect of the API it speaks."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = None
    """Endpoint root, e.g. https://api.z.ai/api/paas/v4 or http://127.0.0.1:30000/v1."""
    api_key: SecretStr | None = None
    """API key; prefer the OPENAI_API_KEY environment variable over writing it in a file."""
    api_key_env: str | None = None
    """Name of an environment variable holding the key (e.g. ZAI_API_KEY)."""
    model: str = "glm-4.6"
    """Model name sent with each request."""
    dialect: str | None = None
    """How requests are shaped: 'openai' (any OpenAI-compatible endpoint), 'glm' (Z.ai's API),
    'glm-sglang' (a GLM model served by SGLang). None: 'glm' for api.z.ai and bigmodel.cn
    endpoints, else 'openai'. The names are those of `agent.model.dialects.DIALECTS`."""
    thinking: bool | None = None
    """GLM thinking on or off (`thinking.type` on Z.ai, `enable_thinking` on SGLang); None: the
    endpoint's default (on for GLM-4.7 and later; GLM-5.3 always thinks)."""
    preserved_thinking: bool | None = None
    """Keep earlier turns' reasoning in the model's context (GLM-4.7 and later; sent as
    `clear_thinking: false`); None: the endpoint's default (off on Z.ai's standard API)."""
    reasoning_effort: str | None = None
    """`reasoning_effort` sent as is (GLM-5.3: low | high | max, default max); None: not sent."""
    tool_choice: Literal["auto", "required"] = "auto"
    """'required' makes every reply call a tool; the glm dialect accepts only 'auto'."""
    timeout_s: float = 120.0
    """Per-request timeout in seconds."""
    max_retries: int = 4
    """Retries with exponential backoff on rate limits (429) and server errors (5xx)."""
    temperature: float = 0.6
    """Sampling temperature (GLM models are tuned for 0.6 in agentic use)."""
    max_tokens: int = 4096
    """Completion token cap per request (reasoning tokens count against it)."""
    context_chars: int | None = None
    """Characters of conversation (returned reasoning included) sent before old tool results and
    old reasoning are compacted; None: the run's `max_context_chars` (60,000)."""
    input_cost_per_mtok: float = 0.0
    """USD per million prompt tokens, for the cost budget."""
    cached_input_cost_per_mtok: float | None = None
    """USD per million prompt tokens served from the endpoint's prompt cache; None: priced as
    other prompt tokens."""
    output_cost_per_mtok: float = 0.0
    """USD per million completion tokens (reasoning tokens included), for the cost budget."""

    def resolved_key(self) -> str | None:
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if self.api_key_env:
            return os.environ.get(self.api_key_env)
        return None


BUILTIN_PROFILES: dict[str, dict[str, Any]] = {
    "zai-glm-5.3": {
        "base_url": "https://api.z.ai/api/paas/v4",
        "api_key_env": "ZAI_API_KEY",
        "model": "glm-5.3",
        "dialect": "glm",
        "thinking": True,
        "preserved_thinking": True,
        "reasoning_effort": "max",
        "max_tokens": 32768,
        "context_chars": 400_000,
        "input_cost_per_mtok": 1.40,
        "cached_input_cost_per_mtok": 0.26,
        "output_cost_per_mtok": 4.40,
    },
    "zai-glm-5.3-flash": {
        "base_url": "https://api.z.ai/api/paas/v4",
        "api_key_env": "ZAI_API_KEY",
        "model": "glm-5.3-flash",
        "dialect": "glm",
        "thinking": True,
        "preserved_thinking": True,
        "max_tokens": 32768,
        "context_chars": 400_000,
        "input_cost_per_mtok": 0.15,
        "cached_input_cost_per_mtok": 0.03,
        "output_cost_per_mtok": 0.50,
    },
    "sglang-glm": {
        "base_url": "http://127.0.0.1:30000/v1",
        "model": "default",
        "dialect": "glm-sglang",
        "thinking": True,
        "preserved_thinking": True,
        "max_tokens": 32768,
    },
}
"""Profiles every configuration has (a profile of the same name in the file replaces one).
Prices are USD per million tokens as published for Z.ai's pay-as-you-go API when this was
written; check https://docs.z.ai/guides/overview/pricing. GLM-5.3's window is 1M tokens: the
Z.ai profiles keep about 100k tokens of conversation (so preserved reasoning stays) before
compacting. `sglang-glm` expects a server started
with GLM's reasoning and tool-call parsers (`infra-agent config profiles` prints the flags)."""


class LLMSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: str | None = None
    """Name of the profile in [llm.profiles] to use; None means the top-level endpoint below."""
    endpoint: LLMProfile = Field(default_factory=LLMProfile)
    """The endpoint used when no profile is selected (filled from OPENAI_* variables)."""
    profiles: dict[str, LLMProfile] = Field(default_factory=dict)
    """Named endpoints, e.g. `zai` and `local-sglang`; the built-in ones are added."""

    @model_validator(mode="after")
    def _builtin_profiles(self) -> LLMSettings:
        for name, fields in BUILTIN_PROFILES.items():
            self.profiles.setdefault(name, LLMProfile.model_validate(fields))
        return self

    def active(self) -> LLMProfile:
        if self.profile is None:
            return self.endpoint
        if self.profile not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise UserError(f"llm.profile '{self.profile}' is not defined (profiles: {known})")
        return self.profiles[self.profile]

    def configured(self) -> bool:
        """True when an endpoint URL is set: only then may `--policy auto` pick the llm policy."""
        return self.active().base_url is not None


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    db: Path | None = None
    """SQLite file of the run store; default: <user data dir>/runs.db."""

    def path(self) -> Path:
        return self.db if self.db is not None else default_data_dir() / "runs.db"


class SandboxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["local", "docker"] = "local"
    """Default sandbox backend for experiments."""
    max_patch_bytes: int = 1_000_000
    """Patches larger than this are refused before anything is applied."""
    docker_image: str = "infra-agent-sandbox:latest"
    """Image used by the docker backend (built locally; no registry pulls)."""
    secret_env_patterns: list[str] = Field(
        default_factory=lambda: ["*KEY*", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*CREDENTIAL*"]
    )
    """Environment variables matching these globs never reach candidate code or exports."""


class ReviewSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    """Bind address of the review UI; loopback unless you mean otherwise."""
    port: int = 8765
    """Port of the review UI (0 picks a free one)."""
    tokens: dict[str, SecretStr] = Field(default_factory=dict)
    """Reviewer name -> token. Empty: a token is generated and printed at start-up."""
    policy: Path | None = None
    """Risk policy TOML (glob rules over files/knobs -> auto-approve | review | forbid)."""
    session_idle_minutes: float = Field(default=480.0, gt=0)
    """A reviewer's browser session ends after this long without a request (minutes)."""
    session_max_hours: float = Field(default=24.0, gt=0)
    """A reviewer's browser session ends this long after sign-in, however busy (hours)."""


class TaskSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    search_path: list[Path] = Field(default_factory=list)
    """Extra folders searched for task folders (each containing task.toml)."""
    default: str = "sglang-cpu-tiny"
    """Task used when `--task` is not given: the embedded default target."""


class Settings(BaseModel):
    """The effective configuration of one invocation."""

    model_config = ConfigDict(extra="forbid")

    llm: LLMSettings = Field(default_factory=LLMSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    review: ReviewSettings = Field(default_factory=ReviewSettings)
    tasks: TaskSettings = Field(default_factory=TaskSettings)
    source: str | None = None
    """The config file this came from, if any (for `config show`)."""


# Environment variable -> dotted settings path. Applied after the file, before flags.
ENV_OVERRIDES: dict[str, str] = {
    "OPENAI_BASE_URL": "llm.endpoint.base_url",
    "OPENAI_API_KEY": "llm.endpoint.api_key",
    "INFRA_AGENT_MODEL": "llm.endpoint.model",
    "INFRA_AGENT_LLM_PROFILE": "llm.profile",
    "INFRA_AGENT_DB": "store.db",
    "INFRA_AGENT_SANDBOX": "sandbox.backend",
}


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise UserError(f"config: '{key}' must be a table to set {dotted}")
    node[keys[-1]] = value


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"config file {path}: cannot read ({exc.strerror})") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"config file {path}: not valid TOML ({exc})") from exc


def _describe_validation(error: ValidationError, source: str) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return f"{source}: field '{where}': {first['msg']}"


def load_settings(
    config_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Settings:
    """Build the effective settings: file, then environment, then `overrides` (from flags).

    `config_path` must exist when given; otherwise `infra-agent.toml` in `cwd` is used if present.
    """
    env = dict(os.environ) if env is None else env
    data: dict[str, Any] = {}
    source: str | None = None
    if config_path is not None:
        if not config_path.is_file():
            raise UserError(f"config file {config_path}: not found")
        data, source = _read_toml(config_path), str(config_path)
    else:
        candidate = (cwd or Path.cwd()) / CONFIG_FILENAME
        if candidate.is_file():
            data, source = _read_toml(candidate), str(candidate)
    for var, dotted in ENV_OVERRIDES.items():
        if env.get(var):
            _set_dotted(data, dotted, env[var])
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise UserError(_describe_validation(exc, source or "configuration")) from exc
    settings.source = source
    return settings


def masked(settings: Settings) -> dict[str, Any]:
    """The settings as plain data with every secret replaced by '***' (for `config show`)."""
    return settings.model_dump(mode="json")  # SecretStr dumps as '**********'
