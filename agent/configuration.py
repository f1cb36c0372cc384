"""How a run is configured (`RunConfig`), which policy drives it (`--policy auto` says why it
chose), and the live objects the graph's nodes use (`AgentContext`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from langgraph.runtime import Runtime
from pydantic import BaseModel, Field, field_validator

from infra_agent.agent.model.dialects import dialect_of
from infra_agent.agent.policies import POLICIES, Policy
from infra_agent.agent.policies.base import ModelTurn, no_script
from infra_agent.agent.runlog import RunLog
from infra_agent.agent.state import AgentState, Budget
from infra_agent.config import LLMSettings
from infra_agent.errors import UserError
from infra_agent.experiments.executors import Executor
from infra_agent.store import RunStore
from infra_agent.store.records import ExperimentRecord
from infra_agent.tasks.manifest import Task
from infra_agent.tasks.patch import DEFAULT_MAX_PATCH_BYTES
from infra_agent.tools.base import ToolRegistry
from infra_agent.tools.context import ToolContext
from infra_agent.tools.looks import LOOK_TOOLS


class RunConfig(BaseModel):
    """What `infra-agent optimize` was asked to do. Stored with the run (no secrets), so a resumed
    run (from the CLI or the review UI) is rebuilt from it."""

    task: str
    """Task name or folder, as given."""
    task_root: str = ""
    """The resolved task folder (so a resume finds the same task)."""
    objective: str = "throughput"
    """throughput | latency | accuracy."""
    policy: str = "search"
    """The policy actually used (after `auto` was resolved): a name in `policies.POLICIES`."""
    policy_reason: str = ""
    """Why this policy (the sentence the CLI showed)."""
    budget: Budget = Field(default_factory=Budget)
    sandbox: str = "local"
    params: dict[str, Any] = Field(default_factory=dict)
    """Task scale parameter overrides."""
    script: str | None = None
    """Script file of the scripted policy (test equipment)."""
    search_strategy: Literal["tpe", "random"] = "tpe"
    """`tpe`: Optuna's TPE over the knobs; `random`: the control. Runs stored before TPE replaced
    the coordinate search resume with TPE."""
    search_batch: int = 1
    """Configurations the search policy proposes per turn (a parallel executor runs them at once)."""
    executor: Literal["local", "ray"] | None = None
    """Run the experiments of one reply as a parallel batch on this executor (None: one at a
    time in this process)."""
    parallel: int = 1
    """Experiments at once on the executor."""
    seed: int = 0
    feedback: Literal["dense", "sparse"] = "dense"
    """`dense` offers every tool; `sparse` only reading, editing, run_experiment and finish (no
    instruments), the setting `infra-agent eval --feedback sparse` compares against."""
    tools: list[str] = Field(default_factory=list)
    """The tool names the run offered its policy (recorded when the run starts)."""
    max_invalid_replies: int = 5
    """Consecutive replies without a valid tool call before the run stops."""
    max_model_failures: int = 3
    """Consecutive failed model requests (after retries) before the run stops."""
    max_context_chars: int = 60_000
    """The llm policy compacts old tool results (and old returned reasoning) beyond this many
    characters of conversation, unless the profile sets its own `context_chars`."""
    max_revisions: int = 1
    """Times a reviewer may send the run back with requested changes."""
    apply_to: str | None = None
    """Where approved patches are applied (default: <store dir>/applied/<run id>/)."""

    @field_validator("policy")
    @classmethod
    def _registered(cls, name: str) -> str:
        if name not in POLICIES:
            raise ValueError(f"unknown policy '{name}' (one of {', '.join(POLICIES)})")
        return name

    @field_validator("search_strategy", mode="before")
    @classmethod
    def _coordinate_is_now_tpe(cls, value: Any) -> Any:
        return "tpe" if value == "coordinate" else value


def resolve_policy(requested: str, llm: LLMSettings, script: Path | None) -> tuple[str, str]:
    """The policy to use and why, in a sentence. `auto` takes `llm` when an endpoint is
    configured, else `search`; it never takes `scripted` (test equipment is chosen explicitly)."""
    if requested == "auto":
        no_script(script)
        if llm.configured():
            profile = llm.active()
            return (
                "llm",
                f"llm policy: an endpoint is configured ({profile.model} at {profile.base_url})"
                f" ({dialect_of(profile).name} dialect)",
            )
        return "search", (
            "search policy: no LLM endpoint is configured (set OPENAI_BASE_URL or llm.profile to "
            "use a model), so the built-in knob search runs"
        )
    spec = POLICIES.get(requested)
    if spec is None:
        raise UserError(f"--policy: '{requested}' is not one of {', '.join(['auto', *POLICIES])}")
    return spec.name, spec.check(llm, script)


class DeferredPolicy:
    """A policy built on its first use: a run resumed only to apply a review decision never needs
    its model endpoint or script."""

    def __init__(self, build: Callable[[], Policy], name: str, model: str | None) -> None:
        self._build = build
        self._policy: Policy | None = None
        self.name = name
        self.model = model

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        if self._policy is None:
            self._policy = self._build()
        return self._policy.next_turn(state, tools)


def build_policy(config: RunConfig, llm: LLMSettings, task: Task) -> Policy:
    """The run's policy object, by its registered name."""
    return POLICIES[config.policy].build(config, llm, task)


@dataclass
class AgentContext:
    """What the nodes use but the checkpoint does not hold: live objects, rebuilt on resume."""

    config: RunConfig
    task: Task
    store: RunStore
    policy: Policy
    tools: ToolRegistry
    tool_context: ToolContext
    log: RunLog
    run_experiment: Callable[..., ExperimentRecord]
    """`infra_agent.experiments.run_experiment` (one experiment in this process)."""
    executor: Executor | None = None
    """Runs a reply's experiments as one parallel batch; None: one at a time in this process."""
    fingerprint: str = ""
    review_policy: Path | None = None
    """The configured `[review] policy` file that judges the run's proposals (None: the bundled
    default)."""
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES
    """The configured `sandbox.max_patch_bytes`: the run's experiments reject a larger diff."""
    on_event: Callable[[str], None] = field(default=lambda text: None)
    """Progress text for the live view (current step)."""

    def budget(self, state: AgentState) -> Budget:
        """The run's budget, extended for each revision a reviewer asked for (no looks where
        the run offers no look)."""
        b, extra = self.config.budget, state.revisions
        looks = b.looks if LOOK_TOOLS & set(self.tools.names()) else 0
        return b.model_copy(
            update={
                "experiments": b.experiments + 2 * extra, "turns": b.turns + 10 * extra,
                "looks": looks,
            }
        )  # fmt: skip


def run_context(runtime: Runtime[AgentContext]) -> AgentContext:
    """The run's context inside a graph node."""
    assert runtime.context is not None
    return runtime.context
