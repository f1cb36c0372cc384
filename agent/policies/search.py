"""The `search` policy: no model; tunes the task's knobs with experiments and verdicts.

Strategy `tpe` (the default) is Optuna's Tree-structured Parzen Estimator over the knobs' value
lists (the skeletons' knob advice, then a small grid over each knob's domain, the default
included). It keeps no state of its own, so a resumed run picks up exactly where it was: every
turn rebuilds an in-memory study from the run's measured experiments (value: the speedup, oriented
so > 1 is better; a configuration that broke, REJECTED, INCORRECT or FAILED, counts as 0) and asks
it for the next unmeasured configurations. Before TPE takes over, the advised values are tried one
knob at a time, each on top of the best configuration proven so far (a coordinate search; what the
skeletons learned from reviewed runs comes first). It stops when every configuration of the space
has been measured. Strategy `random` samples whole configurations from the same value lists (the
benchmark's control).

Each turn is written as the tool calls a model would make (`propose_knobs`, then
`run_experiment`), so the run log reads like any other run and the same graph executes it.
"""

from __future__ import annotations

import itertools
import json
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from infra_agent.agent.policies.base import ModelTurn, Policy, PolicySpec, no_script
from infra_agent.agent.state import AgentState, Message
from infra_agent.config import LLMSettings
from infra_agent.errors import UserError
from infra_agent.store.records import ToolCall
from infra_agent.store.verdict import Verdict
from infra_agent.tasks.manifest import Knob, Task, TaskManifest
from infra_agent.tasks.patch import knob_patch
from infra_agent.tools.skeletons import knob_advice, load_skeletons

if TYPE_CHECKING:
    from infra_agent.agent.configuration import RunConfig


def _has_gpu() -> bool:
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/dri/renderD128")


def _grid(knob: Knob) -> list[Any]:
    """A few values across the knob's domain (default excluded by the caller)."""
    if knob.type == "bool":
        return [True, False]
    if knob.choices is not None:
        return list(knob.choices)
    default = float(knob.default)
    lo, hi = knob.min, knob.max
    if (
        knob.log
        or (lo is not None and hi is not None and lo > 0 and hi / lo >= 16)
        or lo is None
        or hi is None
    ):
        raw = [default * f for f in (0.25, 0.5, 2.0, 4.0)] if default else [1.0, 2.0, 4.0]
    else:
        raw = [lo + (hi - lo) * f for f in (0.0, 0.25, 0.5, 0.75, 1.0)]
    out = []
    for value in raw:
        if lo is not None:
            value = max(value, lo)
        if hi is not None:
            value = min(value, hi)
        out.append(int(round(value)) if knob.type == "int" else value)
    return out


_BROKEN = {Verdict.REJECTED, Verdict.INCORRECT, Verdict.FAILED}


def _hashable(value: Any) -> Any:
    return (
        json.dumps(value, sort_keys=True, default=str) if isinstance(value, list | dict) else value
    )


def _key(name: str) -> str:
    """Knob names compare equal with '-' or '_' (server flags vs Python names)."""
    return name.replace("-", "_").lower()


def candidate_values(manifest: TaskManifest, advice: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Knob name -> values worth trying (advice first, then the grid), knobs with advice first.
    Values outside a knob's domain and knobs that need a GPU on a machine without one are left out."""
    gpu = _has_gpu()
    space: dict[str, list[Any]] = {}
    advised = {_key(n): values for n, values in advice.items()}
    by_key = {_key(n): n for n in manifest.knobs}
    names = [by_key[k] for k in advised if k in by_key]
    names += [n for n in manifest.knobs if _key(n) not in advised]
    for name in names:
        knob = manifest.knobs[name]
        if knob.needs_gpu and not gpu:
            continue
        values: list[Any] = []
        for value in [*advised.get(_key(name), []), *_grid(knob)]:
            try:
                value = knob.validate_value(name, value)
            except UserError:
                continue
            if value not in values:
                values.append(value)
        if values:
            space[name] = values
    return space


def canonical(knobs: dict[str, Any], manifest: TaskManifest) -> dict[str, Any]:
    """Only the knobs that differ from the task's defaults, sorted (one patch per configuration)."""
    return {k: v for k, v in sorted(knobs.items()) if manifest.knobs[k].default != v}


_ASKS = 128
"""TPE suggestions drawn per turn at most before enumerating the space instead."""
_STARTUP = 3
"""Random configurations TPE draws before it models the results (Optuna's default is 10, more
than most budgets here)."""


def _value(outcome: Any) -> float:
    if outcome.verdict in _BROKEN:
        return 0.0
    return float(outcome.speedup) if outcome.speedup is not None else 1.0


class SearchPolicy:
    """Knob search without a model (see the module docstring)."""

    name = "search"
    model: str | None = None

    def __init__(
        self,
        manifest: TaskManifest,
        advice: dict[str, list[Any]] | None = None,
        *,
        strategy: Literal["tpe", "random"] = "tpe",
        batch: int = 1,
        seed: int = 0,
    ) -> None:
        self.manifest = manifest
        self.advice = {_key(n): list(v) for n, v in (advice or {}).items()}
        self.space = candidate_values(manifest, advice or {})
        defaults = self._defaults()
        for name, values in self.space.items():  # the default is a point of the space too
            if defaults[name] not in values:
                values.append(defaults[name])
        self.strategy = strategy
        self.batch = max(1, batch)
        self.seed = seed

    def _defaults(self) -> dict[str, Any]:
        return {n: k.default for n, k in self.manifest.knobs.items()}

    def incumbent(self, state: AgentState) -> tuple[dict[str, Any], float]:
        """The best IMPROVED configuration so far and its speedup (defaults and 1.0 if none)."""
        best, speedup = self._defaults(), 1.0
        for e in state.experiments:
            if e.verdict is Verdict.IMPROVED and e.speedup is not None and e.speedup > speedup:
                best, speedup = {**self._defaults(), **e.knobs}, e.speedup
        return best, speedup

    def _text(self, config: dict[str, Any]) -> str:
        return json.dumps(canonical(config, self.manifest), sort_keys=True, default=str)

    def next_configs(self, state: AgentState) -> list[dict[str, Any]]:
        """The next configurations to verify, as changes from the defaults (empty: nothing left)."""
        measured = {
            self._text({**self._defaults(), **e.knobs}): _value(e) for e in state.experiments
        }
        measured[self._text(self._defaults())] = 1.0  # baseline is what every arm is compared to
        out: list[dict[str, Any]] = []

        def add(config: dict[str, Any]) -> bool:
            text = self._text(config)
            if text in measured or any(self._text(c) == text for c in out):
                return False
            out.append(canonical(config, self.manifest))
            return True

        if self.strategy == "random":
            rng = random.Random(self.seed + len(state.experiments))
            for _ in range(200):
                if len(out) >= self.batch:
                    break
                add({n: rng.choice(vs) for n, vs in self.space.items()})
            return out
        incumbent, _ = self.incumbent(state)
        for name, values in self.space.items():  # advice first, one knob at a time
            for value in self.advice.get(_key(name), []):  # on top of the best so far
                if len(out) < self.batch and value in values:
                    add({**incumbent, name: value})
        size = 1
        for values in self.space.values():
            size *= len(values)
        if len(out) < self.batch and len(measured) < size:
            self._ask_tpe(state, measured, add, self.batch - len(out))
        if len(out) < self.batch:  # TPE keeps suggesting measured points: enumerate the rest
            names = list(self.space)
            for combo in itertools.islice(itertools.product(*self.space.values()), 100_000):
                if len(out) >= self.batch:
                    break
                add(dict(zip(names, combo, strict=True)))
        return out

    def _ask_tpe(
        self, state: AgentState, measured: dict[str, float], add: Any, wanted: int
    ) -> None:
        import optuna
        from optuna.distributions import BaseDistribution, CategoricalDistribution

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        names = list(self.space)
        dists: dict[str, BaseDistribution] = {
            n: CategoricalDistribution(list(range(len(vs)))) for n, vs in self.space.items()
        }
        sampler = optuna.samplers.TPESampler(
            seed=self.seed * 100_003 + len(state.experiments), n_startup_trials=_STARTUP
        )
        study = optuna.create_study(direction="maximize", sampler=sampler)

        def indices(config: dict[str, Any]) -> dict[str, int] | None:
            try:
                return {n: self.space[n].index(config[n]) for n in names}
            except ValueError:  # measured with a value outside the space (advice changed)
                return None

        for e in state.experiments:
            params = indices({**self._defaults(), **e.knobs})
            if params is not None:
                study.add_trial(
                    optuna.trial.create_trial(params=params, distributions=dists, value=_value(e))
                )
        for _ in range(_ASKS):
            trial = study.ask(dists)
            config = {n: self.space[n][trial.params[n]] for n in names}
            text = self._text(config)
            if text in measured:  # tell TPE what it already knows and ask again
                study.tell(trial, measured[text])
                continue
            if add(config):
                wanted -= 1
            study.tell(trial, state=optuna.trial.TrialState.FAIL)  # not measured yet
            if wanted <= 0:
                return

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        last = {t["function"]["name"] for t in tools} == {"finish"}  # the budget is used up
        configs = [] if last else self.next_configs(state)
        incumbent, speedup = self.incumbent(state)
        best = canonical(incumbent, self.manifest) or "task defaults"
        if not configs:
            done = "budget used" if last else "every candidate measured"
            summary = f"{self.strategy} search done: {done}; best {best} ({speedup:.3f}x)"
            call = ToolCall(
                id=f"search_{len(state.messages)}_finish",
                name="finish",
                arguments=json.dumps({"summary": summary}),
            )
            return ModelTurn(message=Message(role="assistant", content=summary, tool_calls=[call]))
        calls: list[ToolCall] = []
        for i, knobs in enumerate(configs):
            rationale = f"{self.strategy} search from incumbent {best} ({speedup:.3f}x)"
            patch = knob_patch(knobs, author="search", rationale=rationale)
            base = f"search_{len(state.messages)}_{i}"
            calls.append(
                ToolCall(
                    id=f"{base}_p",
                    name="propose_knobs",
                    arguments=json.dumps({"knobs": knobs, "rationale": rationale}, default=str),
                )
            )
            calls.append(
                ToolCall(
                    id=f"{base}_x",
                    name="run_experiment",
                    arguments=json.dumps({"patch_id": patch.hash}),
                )
            )
        text = f"{self.strategy} search: incumbent {best} ({speedup:.3f}x); trying " + "; ".join(
            json.dumps(c, default=str) for c in configs
        )
        return ModelTurn(message=Message(role="assistant", content=text, tool_calls=calls))


def _check(llm: LLMSettings, script: Path | None) -> str:
    no_script(script)
    return "search policy (chosen with --policy search)"


def _build(config: RunConfig, llm: LLMSettings, task: Task) -> Policy:
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


SPEC = PolicySpec("search", _check, _build)
