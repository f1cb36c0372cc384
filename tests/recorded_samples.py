"""Every sample of a real sglang-cpu-tiny experiment (experiments/data/sglang_cpu_tiny_batch16.json)
replayed through the measurement in the order it was taken: statistics on real noise, no server."""

from __future__ import annotations

import json
from pathlib import Path

from infra_agent.tasks.harness import Arm, CheckResult, Harness
from infra_agent.tasks.manifest import TaskManifest

RECORDED = Path(__file__).parent / "experiments" / "data" / "sglang_cpu_tiny_batch16.json"
Sample = dict[str, float]


def samples(arm: str) -> list[Sample]:
    """The recorded arm's samples (every key), in measurement order."""
    data = json.loads(RECORDED.read_text())[arm]
    return [dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)]


def aa_pairs() -> dict[str, list[Sample]]:
    """The recorded baseline as an A/A experiment: each sample against the next one taken."""
    recorded = samples("baseline")
    return {"baseline": recorded[0::2], "candidate": recorded[1::2]}


def arms() -> tuple[Arm, Arm]:
    base, cand = (Arm(n, sandbox=None, knobs={}, params={}) for n in ("baseline", "candidate"))  # type: ignore[arg-type]
    return base, cand


class Replay(Harness):
    """Hands each arm its recorded samples in order, going on where the last measurement stopped."""

    def __init__(self, manifest: TaskManifest, by_arm: dict[str, list[Sample]]) -> None:
        super().__init__(manifest, {})
        self.left = {name: iter(found) for name, found in by_arm.items()}

    def check(self, arm: Arm, seed: int) -> CheckResult:
        return CheckResult(passed=True)

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        return next(self.left[arm.name])


def script_timing(task_root: Path) -> None:
    """Make a copy of the test task (tests/experiments/pytask) report scripted latencies instead
    of its clock: each arm alternates 1.0 and 1.3 ms, out of step with the other, so the pair
    ratios alternate 1.3 and 1/1.3 whatever the machine's load. The candidate's code still runs
    and is checked on every sample; the verdict is a NO_CHANGE that no budget resolves."""
    harness = task_root / "harness.py"
    timed = '        return {"latency_ms": min(times) * 1e3}\n'
    text = harness.read_text()
    assert timed in text, "the test task's harness changed: update script_timing"
    scripted = (
        '        k = arm.state["scripted"] = arm.state.get("scripted", 0) + 1\n'
        '        return {"latency_ms": 1.3 if (k % 2 == 0) == (arm.name == "baseline") else 1.0}\n'
    )
    harness.write_text(text.replace(timed, scripted))
