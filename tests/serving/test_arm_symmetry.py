"""Both arms of a serving experiment are measured from the same state (no server, deterministic).

An A/A experiment on sglang-cpu-tiny leaned towards the candidate (1.04-1.07x, once IMPROVED):
the baseline's first sample came straight after the judge's scoring requests with no warm-up,
and in ABBA rounds the candidate's second sample ran on a server that was neither paused nor
warmed while the baseline's ran after a pause and a warm-up (BAAB the other way round, so
whenever sampling stopped after an odd number of rounds one arm had one more of them). Here
stand-in servers log what each is sent, and the harness's own check and `measure` drive them as
an experiment does: every measured run of either arm, in whatever position of its round, must
follow the same steps on its server (paused, resumed, the same number of warm-up requests),
whatever the server did before."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from infra_agent.experiments.arms import SeedSource, effective_params, load_harness
from infra_agent.experiments.measure import measure
from infra_agent.serving.harness.accuracy import score_tokens
from infra_agent.serving.harness.base import ServingHarness
from infra_agent.serving.load.datasets import Session
from infra_agent.serving.load.generator import LoadSpec, RequestRecord, WorkloadResult
from infra_agent.tasks.harness import Arm
from infra_agent.tasks.registry import find_task


class StandIn:
    """Answers like a server of the task (every request its exact tokens, in 1 s) and logs each
    step: 'pause', 'resume', 'score', or the number of prompts of a workload run."""

    def __init__(self, log: list[tuple[str, Any]], name: str) -> None:
        self.log, self.name, self.paused = log, name, False

    def alive(self) -> bool:
        return True

    def pause(self) -> None:
        if not self.paused:
            self.paused = True
            self.log.append((self.name, "pause"))

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.log.append((self.name, "resume"))

    def cpu_seconds(self) -> float:
        return 0.0

    @contextmanager
    def placed_on(self, cpu: int) -> Iterator[bool]:
        self.log.append((self.name, ("on", cpu)))
        yield True

    def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        assert not self.paused, f"{self.name}: sent requests while paused"
        if fn is score_tokens:
            self.log.append((self.name, "score"))
            return [[-6.0] * len(output) for _, output in args[0]]
        sessions: list[Session] = args[0]
        load: LoadSpec = args[1]
        self.log.append((self.name, len(sessions)))
        records = []
        for i, s in enumerate(sessions):
            n = s.turns[0].output_len
            records.append(
                RequestRecord(
                    session=i, turn=0, success=True, prompt_tokens=len(s.turns[0].new_ids),
                    prompt_ids=list(s.turns[0].new_ids), output_tokens=n, latency_s=0.5,
                    ttft_s=0.1, output_ids=[(i + k) % 100 for k in range(n)],
                    meta={"completion_tokens": n},
                )
            )  # fmt: skip
        return WorkloadResult(records=records, duration_s=1.0, load=load)


def _experiment() -> tuple[ServingHarness, list[tuple[str, Any]], int]:
    """sglang-cpu-tiny's harness on two stand-in servers, run as the cascade runs it after
    `prepare` (the candidate started last): the accuracy check of both arms, then the
    performance stage. Returns the harness, the log and the measured run's prompt count."""
    task = find_task("sglang-cpu-tiny")
    harness = load_harness(task, effective_params(task.manifest, None))
    assert isinstance(harness, ServingHarness)
    log: list[tuple[str, Any]] = []
    arms = [Arm(name, sandbox=None, knobs={}, params={}) for name in ("baseline", "candidate")]  # type: ignore[arg-type]
    for arm in arms:
        arm.state.update(server=StandIn(log, arm.name), runs={})
        harness.arms[arm.name] = arm
    harness.activate("candidate")  # as `prepare` leaves it: the candidate started last
    seeds = SeedSource()
    seed = seeds.fresh()
    for arm in arms:
        assert harness.check(arm, seed).passed
    measure(harness, *arms, task.manifest, seeds, deadline=math.inf)
    return harness, log, int(harness.params["num_prompts"])


def _preparations(log: list[tuple[str, Any]], measured_prompts: int) -> dict[str, list[tuple]]:
    """Per arm, for each measured run in order: the steps on its server since it last served a
    request that was not a warm-up (its previous measured run or a scoring request)."""
    found: dict[str, list[tuple]] = {"baseline": [], "candidate": []}
    since: dict[str, list[Any]] = {"baseline": [], "candidate": []}
    for name, step in log:
        if step == measured_prompts:
            found[name].append(tuple(since[name]))
            since[name] = []
        elif step == "score":
            since[name] = []
        else:  # the CPU is compared pair by pair (test_both_runs_of_a_pair_start_on_one_cpu)
            since[name].append("placed" if isinstance(step, tuple) else step)
    return found


def test_every_measured_run_is_prepared_alike_in_both_arms() -> None:
    harness, log, prompts = _experiment()
    assert ("baseline", "score") in log  # the judge scored on the baseline before measuring
    warm = int(harness.params["warmup_prompts"])
    assert warm > 0
    preparations = _preparations(log, prompts)
    assert len(preparations["baseline"]) == len(preparations["candidate"]) >= 6
    # The same steps before every run of either arm: after a switch, after scoring, and for the
    # second of two runs in a row alike.
    for name, steps in preparations.items():
        assert set(steps) == {("pause", "resume", "placed", warm)}, (name, Counter(steps))


def test_the_arms_are_prepared_alike_at_every_point_sampling_may_stop() -> None:
    """Whatever the round count when sampling stops, each arm had as many runs of each kind of
    preparation (the multisets of the first n pairs agree for every n the stage may stop at)."""
    harness, log, prompts = _experiment()
    preparations = _preparations(log, prompts)
    checked = 1  # the accuracy check's run of each arm comes first
    pairs = len(preparations["baseline"]) - checked
    for n in range(2, pairs + 1, 2):  # after each round (two pairs)
        base = Counter(preparations["baseline"][checked : checked + n])
        cand = Counter(preparations["candidate"][checked : checked + n])
        assert base == cand, (n, base, cand)


def test_both_runs_of_a_pair_start_on_one_cpu_and_the_cpus_take_turns() -> None:
    """A busy server keeps the core it first got for its whole life (seen on two A/A servers:
    each scheduler on one core in every sample taken over 6 s, one on each), so the arms' pairs
    would compare two cores as well as two servers. Each pair's runs start on the same CPU, the CPUs in turn."""
    _, log, prompts = _experiment()
    placed: dict[str, list[int]] = {"baseline": [], "candidate": []}
    cpu: dict[str, int] = {}
    for name, step in log:
        if isinstance(step, tuple):
            cpu[name] = step[1]
        elif step == prompts:
            placed[name].append(cpu.pop(name))
    assert placed["baseline"] == placed["candidate"]  # runs of one seed, in the same order
    usable = sorted(os.sched_getaffinity(0))
    turns = placed["baseline"][1:]  # after the accuracy check's
    if len(usable) > 1:
        assert Counter(turns)[usable[0]] - Counter(turns)[usable[1]] in (-1, 0, 1), turns
