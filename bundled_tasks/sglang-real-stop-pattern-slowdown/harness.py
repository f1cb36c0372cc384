"""sglang-real-stop-pattern-slowdown: long streamed answers with stop conditions crawl.

The serving harness with the extraction client's request shape: every request carries the same
stop string and stop pattern (params `stop`, `stop_regex`), which the random answers of the tiny
model never meet, so every answer runs to its full length.
"""

from pathlib import Path
from typing import Any

from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.load.generator import LoadSpec
from infra_agent.tasks.workload import Workload


class TaskHarness(ServingHarness):
    deployment_path = Path(__file__).parent / "deployment.toml"

    def load(self, seed: int) -> LoadSpec:
        stops = {k: [str(self.params[k])] for k in ("stop", "stop_regex")}
        return super().load(seed).model_copy(update=stops)

    def workload(self, knobs: dict[str, Any]) -> Workload:
        asked = super().workload(knobs)
        p = self.params
        extra = f"; every request stops at {p['stop']!r} or the pattern {p['stop_regex']!r}"
        return asked.model_copy(update={"summary": asked.summary + extra})
