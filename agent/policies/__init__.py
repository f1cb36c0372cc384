"""Policies decide the agent's next move: `llm` (a model over an OpenAI-compatible API),
`search` (no model: knob search seeded by the skeletons), `scripted` (replays recorded replies;
test equipment, chosen only explicitly).

A policy is one module defining its `PolicySpec` (`base.py`) plus one line in `POLICIES` below:
the CLI's `--policy`, the run configuration's allowed values and the runner all read it.
"""

from infra_agent.agent.policies import llm, scripted, search
from infra_agent.agent.policies.base import Policy, PolicySpec

POLICIES: dict[str, PolicySpec] = {
    spec.name: spec
    for spec in (
        llm.SPEC,
        search.SPEC,
        scripted.SPEC,
    )
}

__all__ = ["POLICIES", "Policy", "PolicySpec"]
