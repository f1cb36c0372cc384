"""Recorded samples of real experiments (tests/experiments/data/), replayed in the order they were
taken: through the statistics alone (`Replay`: real noise, no server), or in place of the clock of
a real experiment (`replay_timing`: the arms' code still runs and is checked on every sample, the
verdict is the one these samples give, whatever the load of the machine running the test).

sglang_cpu_tiny_batch16.json came from a real sglang-cpu-tiny experiment; the others from
`benchmarks/record_samples.py CASE` (each file's "what" says the experiment, date and load)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from infra_agent.tasks.harness import Arm, CheckResult, Harness
from infra_agent.tasks.manifest import TaskManifest

RECORDED = Path(__file__).parent / "experiments" / "data" / "sglang_cpu_tiny_batch16.json"
Sample = dict[str, float]


DATA = RECORDED.parent


def samples(arm: str, recorded: Path = RECORDED) -> list[Sample]:
    """The recorded arm's samples (every key), in measurement order."""
    data = json.loads(recorded.read_text())[arm]
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


REPLAYED_SAMPLE = """

# Test equipment (tests/recorded_samples.py: replay_timing): each sample still runs and checks the
# arm's code, then reports the next sample recorded for that arm ({recorded}) instead of what
# the clock read, so the verdict is the one the recorded samples give.
import json as _json

_RECORDED = _json.loads(open({recorded!r}).read())
_Clocked = {cls}


class {cls}(_Clocked):
    def sample(self, arm, seed):
        measured = super().sample(arm, seed)
        taken = arm.state["replayed"] = arm.state.get("replayed", -1) + 1
        recorded = {{k: v for k, v in _RECORDED[arm.name].items() if k in {keys!r} or not {keys!r}}}
        count = len(next(iter(recorded.values())))
        return measured | {{key: values[taken % count] for key, values in recorded.items()}}
"""


def replay_timing(task_root: Path, case: str, keys: tuple[str, ...] = ()) -> Path:
    """Make the task copy at `task_root` report the samples of `DATA/<case>.json` (a real
    experiment of that task, recorded by benchmarks/record_samples.py) in place of its own
    measurements (only `keys` of them when given: the clocked ones, the others as measured now):
    every sample still runs the arm's code and checks it (a wrong output fails as before). The time budget of sampling is lifted, as it was while recording, so sampling stops
    where the statistics say, not where a loaded machine ran out of seconds; a replay that
    outlasts the recording starts it again. Returns the recording."""
    recorded = DATA / f"{case}.json"
    assert recorded.exists(), f"no recording {recorded}: run benchmarks/record_samples.py {case}"
    harness = task_root / "harness.py"
    text = harness.read_text()
    cls = "TaskHarness"
    assert f"class {cls}(" in text, "the task's harness class is not TaskHarness"
    harness.write_text(text + REPLAYED_SAMPLE.format(recorded=str(recorded), cls=cls, keys=keys))
    toml = task_root / "task.toml"
    budget = re.sub(r"(?m)^measure_budget_s = .*\n", "", toml.read_text())
    toml.write_text(budget.replace("[budget]\n", "[budget]\nmeasure_budget_s = 1e6\n", 1))
    return recorded
