"""How a run is configured, and which policy drives it (`--policy auto` says why it chose)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from infra_agent.agent.state import Budget
from infra_agent.config import LLMSettings
from infra_agent.errors import UserError
from infra_agent.tasks.manifest import Task

PolicyName = Literal["auto", "llm", "search", "scripted"]


class RunConfig(BaseModel):
    """What `infra-agent optimize` was asked to do. Stored with the run (no secrets), so a resumed
    run (from the CLI or the review UI) is rebuilt from it."""

    task: str
    """Task name or folder, as given."""
    task_root: str = ""
    """The resolved task folder (so a resume finds the same task)."""
    objective: str = "throughput"
    """throughput | latency | accuracy."""
    policy: Literal["llm", "search", "scripted"] = "search"
    """The policy actually used (after `auto` was resolved)."""
    policy_reason: str = ""
    """Why this policy (the sentence the CLI showed)."""
    budget: Budget = Field(default_factory=Budget)
    sandbox: str = "local"
    params: dict[str, Any] = Field(default_factory=dict)
    """Task scale parameter overrides."""
    script: str | None = None
    """Script file of the scripted policy (test equipment)."""
    search_strategy: Literal["coordinate", "random"] = "coordinate"
    search_batch: int = 1
    """Configurations the search policy proposes per turn (a parallel executor runs them at once)."""
    executor: Literal["local", "ray"] | None = None
    """Run the experiments of one reply as a parallel batch on this executor (None: one at a
    time in this process)."""
    parallel: int = 1
    """Experiments at once on the executor."""
    seed: int = 0
    max_invalid_replies: int = 5
    """Consecutive replies without a valid tool call before the run stops."""
    max_model_failures: int = 3
    """Consecutive failed model requests (after retries) before the run stops."""
    max_context_chars: int = 60_000
    """The llm policy compacts old tool results beyond this many characters of conversation."""
    max_revisions: int = 1
    """Times a reviewer may send the run back with requested changes."""
    apply_to: str | None = None
    """Where approved patches are applied (default: <store dir>/applied/<run id>/)."""


def resolve_policy(requested: PolicyName, llm: LLMSettings, script: Path | None) -> tuple[str, str]:
    """The policy to use and why, in a sentence. `auto` never picks `scripted`."""
    if requested == "scripted":
        if script is None:
            raise UserError("--policy scripted needs --script FILE (it replays recorded replies)")
        return "scripted", f"scripted policy (test equipment) replaying {script}"
    if script is not None:
        raise UserError("--script is only used with --policy scripted")
    if requested == "llm":
        if not llm.configured():
            raise UserError(
                "--policy llm needs an endpoint: set OPENAI_BASE_URL (and OPENAI_API_KEY) or "
                "llm.endpoint.base_url / llm.profile in infra-agent.toml"
            )
        profile = llm.active()
        return "llm", f"llm policy: model {profile.model} at {profile.base_url}"
    if requested == "search":
        return "search", "search policy (chosen with --policy search)"
    if llm.configured():
        profile = llm.active()
        return (
            "llm",
            f"llm policy: an endpoint is configured ({profile.model} at {profile.base_url})",
        )
    return "search", (
        "search policy: no LLM endpoint is configured (set OPENAI_BASE_URL or llm.profile to use "
        "a model), so the built-in knob search runs"
    )


class DeferredPolicy:
    """A policy built on its first use: a run resumed only to apply a review decision never needs
    its model endpoint or script."""

    def __init__(self, build: Callable[[], Any], name: str, model: str | None) -> None:
        self._build = build
        self._policy: Any = None
        self.name = name
        self.model = model

    def next_turn(self, state: Any, tools: list[dict[str, Any]]) -> Any:
        if self._policy is None:
            self._policy = self._build()
        return self._policy.next_turn(state, tools)


def build_policy(config: RunConfig, llm: LLMSettings, task: Task) -> Any:
    """Construct the run's policy object from its configuration."""
    if config.policy == "scripted":
        from infra_agent.agent.policies.scripted import ScriptedPolicy, load_script

        assert config.script is not None
        return ScriptedPolicy(load_script(Path(config.script)))
    if config.policy == "llm":
        from infra_agent.agent.policies.llm import LLMPolicy, OpenAIChatModel

        return LLMPolicy(OpenAIChatModel(llm.active()), max_context_chars=config.max_context_chars)
    from infra_agent.agent.policies.search import SearchPolicy
    from infra_agent.tools.skeletons import knob_advice, load_skeletons

    if not task.manifest.knobs:
        raise UserError(
            f"task {task.name} has no knobs, so the search policy has nothing to tune; "
            "configure an LLM endpoint (OPENAI_BASE_URL) to let a model write patches"
        )
    return SearchPolicy(
        task.manifest,
        knob_advice(load_skeletons()),
        strategy=config.search_strategy,
        batch=config.search_batch,
        seed=config.seed,
    )
