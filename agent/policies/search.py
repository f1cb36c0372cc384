"""The `search` policy: no model; tunes the task's knobs with experiments and verdicts.

Strategy `coordinate` (the default) is a greedy coordinate search that needs no state of its own,
so a resumed run picks up exactly where it was: the incumbent is the best `IMPROVED` configuration
measured so far (the task's defaults until there is one); the candidates are its neighbours, one
knob changed at a time, with values from the skeletons' knob advice first and then a small grid
over the knob's domain, taken round-robin over the knobs (each knob's most promising value before
any knob's second); a knob value seen only in configurations that broke (REJECTED, INCORRECT,
FAILED) is not tried again; the next `batch` unmeasured neighbours are proposed and verified. It stops
when every neighbour of the incumbent has been measured. Strategy `random` samples whole
configurations from the same value lists (the benchmark's control).

Each turn is written as the tool calls a model would make (`propose_knobs`, then
`run_experiment`), so the run log reads like any other run and the same graph executes it.
"""

from __future__ import annotations

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


class SearchPolicy:
    """Knob search without a model (see the module docstring)."""

    name = "search"
    model: str | None = None

    def __init__(
        self,
        manifest: TaskManifest,
        advice: dict[str, list[Any]] | None = None,
        *,
        strategy: Literal["coordinate", "random"] = "coordinate",
        batch: int = 1,
        seed: int = 0,
    ) -> None:
        self.manifest = manifest
        self.space = candidate_values(manifest, advice or {})
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

    def _measured(self, state: AgentState) -> set[str]:
        return {json.dumps(e.knobs, sort_keys=True, default=str) for e in state.experiments}

    def broken_values(self, state: AgentState) -> set[tuple[str, Any]]:
        """Knob values seen only in configurations that broke (REJECTED, INCORRECT, FAILED):
        not tried again in other combinations."""
        seen_ok: set[tuple[str, Any]] = set()
        seen_bad: set[tuple[str, Any]] = set()
        for e in state.experiments:
            pairs = {(k, _hashable(v)) for k, v in e.knobs.items()}
            (seen_bad if e.verdict in _BROKEN else seen_ok).update(pairs)
        return seen_bad - seen_ok

    def next_configs(self, state: AgentState) -> list[dict[str, Any]]:
        """The next configurations to verify (empty: nothing left to try)."""
        measured = self._measured(state)
        out: list[dict[str, Any]] = []

        def add(config: dict[str, Any]) -> None:
            key = canonical(config, self.manifest)
            text = json.dumps(key, sort_keys=True, default=str)
            if key and text not in measured and key not in out:
                out.append(key)

        if self.strategy == "random":
            rng = random.Random(self.seed + len(state.experiments))
            for _ in range(200):
                if len(out) >= self.batch:
                    break
                add(
                    {
                        n: rng.choice([self.manifest.knobs[n].default, *vs])
                        for n, vs in self.space.items()
                    }
                )
            return out
        incumbent, _ = self.incumbent(state)
        broken = self.broken_values(state)
        # Neighbours by rank, round-robin over knobs: every knob's most promising value first.
        ranked = sorted(
            (rank, order, name, value)
            for order, (name, values) in enumerate(self.space.items())
            for rank, value in enumerate(values)
            if value != incumbent[name] and (name, _hashable(value)) not in broken
        )
        for _, _, name, value in ranked:
            if len(out) >= self.batch:
                break
            add({**incumbent, name: value})
        return out

    def next_turn(self, state: AgentState, tools: list[dict[str, Any]]) -> ModelTurn:
        configs = self.next_configs(state)
        incumbent, speedup = self.incumbent(state)
        best = canonical(incumbent, self.manifest) or "task defaults"
        if not configs:
            summary = f"{self.strategy} search done: every candidate measured; best {best} ({speedup:.3f}x)"
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
