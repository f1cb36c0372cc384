"""`infra-agent config show`: the effective configuration; `infra-agent config profiles`: the LLM
profiles at hand, the dialect each speaks, and how to serve a GLM model with SGLang so that
reasoning and tool calls come back as separate fields."""

from __future__ import annotations

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from infra_agent.agent.model.dialects import SGLANG_GLM_FLAGS, dialect_of
from infra_agent.cli.context import current
from infra_agent.config import BUILTIN_PROFILES, LLMProfile, masked
from infra_agent.errors import UserError
from infra_agent.output import emit

config_app = typer.Typer(help="The effective configuration.", no_args_is_help=True)

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document on stdout, nothing else.")


@config_app.command("show")
def show_config(as_json: bool = JSON_OPT) -> None:
    """Print the effective configuration (file < environment < flags) with secrets masked."""
    settings = current().settings()
    data = masked(settings)

    def render(console: Console) -> None:
        import tomllib  # noqa: F401  (the file format shown)

        console.print(f"# source: {settings.source or 'defaults (no infra-agent.toml found)'}")
        console.print_json(data=data)

    emit(data, render, as_json=as_json)


class ProfileView(BaseModel):
    """One configured profile as `config profiles` shows it (no secrets)."""

    name: str
    active: bool
    builtin: bool
    """Defined by infra-agent (`config.BUILTIN_PROFILES`), not in the configuration file."""
    model: str
    base_url: str | None
    dialect: str | None
    """The dialect requests are sent in (named or detected); None when the profile is unusable."""
    problem: str | None = None
    """Why the profile cannot be used, in a sentence."""
    thinking: bool | None
    preserved_thinking: bool | None
    reasoning_effort: str | None
    key_env: str | None


def _view(name: str, profile: LLMProfile, active: bool) -> ProfileView:
    try:
        dialect, problem = dialect_of(profile).name, None
    except UserError as exc:
        dialect, problem = None, str(exc)
    builtin = BUILTIN_PROFILES.get(name)
    return ProfileView(
        name=name,
        active=active,
        builtin=builtin is not None and profile == LLMProfile.model_validate(builtin),
        model=profile.model,
        base_url=profile.base_url,
        dialect=dialect,
        problem=problem,
        thinking=profile.thinking,
        preserved_thinking=profile.preserved_thinking,
        reasoning_effort=profile.reasoning_effort,
        key_env=profile.api_key_env,
    )


def profile_views() -> list[ProfileView]:
    """The top-level endpoint (when it has a URL) and every named profile, sorted by name."""
    llm = current().settings().llm
    views = [_view(n, p, llm.profile == n) for n, p in sorted(llm.profiles.items())]
    if llm.endpoint.base_url is not None:
        views.insert(0, _view("(endpoint)", llm.endpoint, llm.profile is None))
    return views


@config_app.command("profiles")
def profiles(as_json: bool = JSON_OPT) -> None:
    """List the LLM profiles (built-in and configured) and the API dialect each speaks."""
    views = profile_views()

    def render(console: Console) -> None:
        table = Table("profile", "dialect", "model", "thinking", "endpoint")
        table.columns[0].no_wrap = True
        for v in views:
            mark = "* " if v.active else ""
            thinking = "-" if v.thinking is None else ("on" if v.thinking else "off")
            if v.preserved_thinking:
                thinking += ", preserved"
            if v.reasoning_effort:
                thinking += f", effort {v.reasoning_effort}"
            table.add_row(
                mark + v.name, v.dialect or f"[red]{v.problem}[/]", v.model, thinking,
                v.base_url or "-",
            )  # fmt: skip
        console.print(table)
        console.print(
            "* active. Select one with llm.profile (infra-agent.toml) or "
            "INFRA_AGENT_LLM_PROFILE; built-in ones: " + ", ".join(BUILTIN_PROFILES)
        )
        console.print("Serving GLM with SGLang (reasoning and tool calls as separate fields):")
        for models, flags in SGLANG_GLM_FLAGS.items():
            line = f"python -m sglang.launch_server --model-path MODEL {flags} --port 30000"
            console.print(f"  {models}: {line} --enable-cache-report", soft_wrap=True)

    emit(views, render, as_json=as_json)
