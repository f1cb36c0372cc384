"""Localizing a serving task's slowdown on the live server, by measurement.

`diagnose_throughput(harness, arm)` reproduces the symptom with the task's own workload and
localizes it with instruments attached to the arm's SGLang processes (nothing the task author
wrote is read; the server runs the arm's baseline, fault included):

1. a GIL trace of the scheduler process under the task's load (`feedback.gil`): when a thread
   other than the scheduler's main thread holds the GIL while the main thread waits for it,
   that thread and its function are the localization;
2. otherwise function profiles (`feedback.pyprofile`) of the scheduler, the front end (the
   HTTP server's process: its TokenizerManager tokenizes, streams and keeps each request's
   state) and the detokenizer at a light load (a few requests in flight) and at the task's load,
   with each process's CPU time. The process to look in is the scheduler, unless the busier of
   the other two used more CPU than the scheduler at the task's load (a fault in request
   handling, streaming, tokenizing or detokenizing, which the scheduler only waits for), or
   what grows in the scheduler is its idle loop (it waits), or a helper's CPU per generated
   token grows with the answer's length (`lengths.helper_growth`: the workload again with
   answers a quarter as long; a helper runs no model, so its work per token should not depend
   on the answer's length); a busy process not looked in has its hottest functions shown. In
   it, each function's time per generated token (with its callees): where work that grows with
   the load (with the number of waiting or running requests), or with the answer's length,
   enters, the outermost function growing nearly as fast as the fastest-growing work, is the
   localization (`growth_entry`); where nothing in the scheduler grows with the load, what
   grows with the answer outside the model's forward pass (`lengths.outside_model`: attention
   grows with the context by design);
3. otherwise that process's SGLang function with the most self time at the task's load.

Function names are as py-spy reads them (`Class.method`), files relative to the package
('sglang/srt/managers/scheduler.py').
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra_agent.feedback.gil import PySpyUnavailable
from infra_agent.feedback.pyprofile import FunctionProfile, FunctionTime
from infra_agent.serving.instruments.lengths import (
    LENGTH_CUT,
    LENGTH_MIN_OUTPUT,
    LENGTH_NEAR,
    helper_growth,
    outside_model,
)
from infra_agent.serving.instruments.live import describe
from infra_agent.serving.instruments.tracing import trace_during
from infra_agent.serving.overlay import installed_package
from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Diagnosis, Localization

LIGHT_CONCURRENCY = 4
LIGHT_PROMPTS = 128
"""Requests of the light-load profile: its resolution. At 32 (0.6 s of light load on
sglang-queue-collapse) the injected scheduling pass had no light sample at all, its growth was
only a floor, and its caller was named; a slow server at a light load can take minutes."""
GROWTH = 2.0
"""A function whose time per generated token is this many times higher at the task's load than
at the light load scales with the load."""
MIN_SHARE = 0.05
"""...and it must hold at least this share of the scheduler's active samples."""
FRONT = "tokenizer"
"""The front end's role (`serving.instruments.tracing.ROLES`): SGLang's HTTP server process."""
FRONT_MIN_CORES = 0.3
"""The front end is looked in only when it kept at least this share of a core busy at the
task's load (and more than the scheduler did)."""
IDLE_LOOP = "Scheduler.on_idle"
"""What the scheduler runs when it has no batch: where that grows with the load and the busiest
helper used at least half the scheduler's CPU, the scheduler waits for it (sglang-real-scored-
stream: the front end at 0.6 cores, below the scheduler's 0.7-0.8, held the fault, and the
scheduler's growth was in this loop, 43-55x). A busy scheduler beside a quieter helper
(label-burst: 0.94 cores against 0.38) is not waiting; its idle loop is never the answer."""


HELPERS = {FRONT: "front end", "detokenizer": "detokenizer"}
"""The processes beside the scheduler that diagnose profiles (role -> what it is called)."""


@dataclass
class ProfiledRun:
    """One workload with the scheduler, the front end and the detokenizer profiled, and their
    CPU use."""

    scheduler: FunctionProfile
    front: FunctionProfile | None
    """None where the front end could not be profiled (the scheduler's profile still stands)."""
    result: Any
    cpu_s: dict[str, float]
    """Role -> CPU-seconds over the workload."""
    wall_s: float
    detokenizer: FunctionProfile | None = None

    @property
    def cores(self) -> dict[str, float]:
        """Role -> CPU-seconds per second of the workload (1.0: one core busy throughout)."""
        return {role: c / max(self.wall_s, 1e-9) for role, c in self.cpu_s.items()}

    def helper(self, role: str) -> FunctionProfile | None:
        return self.front if role == FRONT else self.detokenizer


def package_dirs(harness: Any, arm: Any) -> list[Path]:
    """Where the arm's server imports SGLang from: its overlay (if any) and the installed
    package (both read as 'sglang/...')."""
    dirs = [installed_package(harness.deployment.sglang_version)]
    overlay = arm.state.get("overlay")
    if overlay is not None:
        dirs.insert(0, Path(overlay) / "sglang")
    return dirs


def profiled_run(
    harness: Any, arm: Any, seed: int, *, concurrency: int | None, prompts: int, cut: int = 1
) -> ProfiledRun:
    """The task's request shape at a given concurrency (answers `cut` times shorter), with the
    scheduler, the front end and the detokenizer profiled throughout and their CPU time counted."""
    sessions = [
        s.model_copy(update={"turns": [
            t.model_copy(update={"output_len": max(1, t.output_len // cut)}) for t in s.turns
        ]})
        for s in harness.sessions(prompts, seed=seed)
    ]  # fmt: skip
    load = harness.load(seed).model_copy(update={"max_concurrency": concurrency})
    server = harness.server(arm)
    (trace, front, detok), result = trace_during(server, sessions, load, ["scheduler", *HELPERS])
    if trace.profile is None:
        raise PySpyUnavailable("; ".join(trace.errors))
    cpu = {t.role: t.cpu_s for t in (trace, front, detok) if t.cpu_s is not None}
    wall = result.duration_s if result is not None else 0.0  # the workload's
    return ProfiledRun(trace.profile, front.profile, result, cpu, wall, detok.profile)


def _per_token(rows: list[FunctionTime], tokens: int) -> dict[str, float]:
    """Self samples per 1000 generated tokens, by function."""
    return {r.where: 1000.0 * r.self_samples / max(tokens, 1) for r in rows}


def diagnose_throughput(harness: Any, arm: Any, samples: int = 2) -> Diagnosis:
    """Reproduce the task's throughput and localize where the scheduler spends it."""
    metric = harness.manifest.metric.name
    values = [harness.sample(arm, DIAGNOSE_SEED + i)[metric] for i in range(samples)]
    median = statistics.median(values)
    evidence = [f"{metric} per sample: " + ", ".join(f"{v:.4g}" for v in values)]
    instruments = ["harness.sample"]
    culprit = gil_culprit(harness, harness.server(arm), evidence, instruments)
    profiles = Profiles.measure(harness, arm, evidence, instruments)
    localization, strong = localize(culprit, profiles, evidence)
    unit = harness.manifest.metric.unit
    return Diagnosis(
        reproduced=strong,
        symptom=f"{metric} median {median:.4g} {unit} over {samples} samples of the task's "
        f"workload; {'one place stands out' if strong else 'no single place stands out'} in "
        f"the scheduler's GIL trace and the {profiles.process}'s profiles",
        measured={metric: median, "profile_samples": float(profiles.heavy.samples)},
        localization=localization,
        evidence=evidence,
        instruments=instruments,
    )


def gil_culprit(harness: Any, server: Any, evidence: list[str], instruments: list[str]) -> Any:
    """The thread (a `gil` culprit) that holds the GIL while the scheduler's main thread waits
    for it (or, where the trace cannot tell a GIL wait from sleep, holds it most of the time);
    None when the main thread is not kept waiting by another thread."""
    sessions = harness.sessions(int(harness.params["num_prompts"]), seed=DIAGNOSE_SEED + 7)
    (trace,), _ = trace_during(
        server, sessions, harness.load(DIAGNOSE_SEED + 7), ["scheduler"], profile=False, gil_s=4.0
    )
    report = trace.gil
    if report is None:
        evidence.append(f"GIL trace unavailable: {'; '.join(trace.errors)}")
        return None
    instruments.append(f"gil.trace_pid scheduler ({report.method})")
    evidence.extend(report.render().splitlines()[:4])
    found = report.culprit()
    main = next((t for t in report.threads if t.thread == "MainThread"), None)
    holder = next((t for t in report.threads if t.thread == found.thread), None)
    if found.thread not in (None, "MainThread") and (
        (main is not None and main.waiting >= 0.1) or (holder is not None and holder.holding >= 0.5)
    ):
        return found
    return None


@dataclass
class Profiles:
    """The function profiles, at a light load and at the task's load, of the process to look
    in: the scheduler, or the front end where it used more CPU at the task's load."""

    light: FunctionProfile
    heavy: FunctionProfile
    light_tokens: int
    heavy_tokens: int
    dirs: list[Path]
    heavy_rows: list[Any]
    process: str = "scheduler"
    """'scheduler' or 'front end' (the HTTP server's process)."""
    axis: str = "load"
    """What `light` differs in: 'load' (requests in flight) or 'answer length'."""
    short: tuple[FunctionProfile, int] | None = None
    """The scheduler's profile and output tokens with answers `LENGTH_CUT` times shorter (None:
    the task's answers are short, or the look is in a helper)."""

    @classmethod
    def measure(
        cls, harness: Any, arm: Any, evidence: list[str], instruments: list[str]
    ) -> Profiles:
        p, dirs = harness.params, package_dirs(harness, arm)
        conc, n = int(p["max_concurrency"]) or None, int(p["num_prompts"])
        light = profiled_run(
            harness, arm, DIAGNOSE_SEED + 11,
            concurrency=LIGHT_CONCURRENCY, prompts=min(int(p["num_prompts"]), LIGHT_PROMPTS),
        )  # fmt: skip
        heavy = profiled_run(harness, arm, DIAGNOSE_SEED + 13, concurrency=conc, prompts=n)
        instruments.append(
            "pyprofile.profile_pid scheduler, front end and detokenizer (light load, task load)"
        )
        evidence.append(f"light load ({LIGHT_CONCURRENCY} in flight): {describe(light.result)}")
        evidence.append(f"task load: {describe(heavy.result)}")
        lt, ht = _tokens(light.result), _tokens(heavy.result)
        look, profiled = _process_to_look_in(light, heavy, dirs, evidence)
        axis, short = "load", None
        if int(p.get("output_len", 0)) >= LENGTH_MIN_OUTPUT and heavy.cpu_s:
            short = profiled_run(  # as many tokens as the task's run, as many in flight
                harness, arm, DIAGNOSE_SEED + 13, concurrency=conc or n, prompts=n * LENGTH_CUT,
                cut=LENGTH_CUT,
            )  # fmt: skip
            st = _tokens(short.result)
            instruments.append(f"the same profiles with answers {LENGTH_CUT}x shorter")
            evidence.append(f"answers {LENGTH_CUT}x shorter: {describe(short.result)}")
            if (grown := helper_growth(short, heavy, (st, ht), HELPERS, evidence)) is not None:
                look, light, lt, axis = grown, short, st, "answer length"
        if look is not None:
            process, lp, hp = HELPERS[look], light.helper(look), heavy.helper(look)
            assert lp is not None and hp is not None
        else:
            process, lp, hp = "scheduler", light.scheduler, heavy.scheduler
        light_rows, heavy_rows = lp.functions(dirs, limit=200), hp.functions(dirs, limit=200)
        light_cost, heavy_cost = _per_token(light_rows, lt), _per_token(heavy_rows, ht)
        evidence.append(f"{process} profile, hottest functions at the task's load:")
        evidence.extend(
            f"  {r.self_share:5.1%} self  {heavy_cost[r.where]:7.2f} vs "
            f"{light_cost.get(r.where, 0.0):7.2f} samples/1k tokens  {r.where}"
            for r in heavy_rows[:8]
        )
        sched = heavy.cores.get("scheduler")
        for role in profiled:  # a process this busy is worth a look, not the verdict
            cores, shown = heavy.cores.get(role, 0.0), heavy.helper(role)
            if HELPERS[role] != process and sched and cores >= sched / 2 and shown is not None:
                evidence.append(
                    f"{HELPERS[role]} profile (busy, not looked in), hottest at the task's load:"
                )
                evidence.extend(
                    f"  {r.self_share:5.1%} self  {r.where}" for r in shown.functions(dirs, limit=3)
                )
        kept = (
            (short.scheduler, _tokens(short.result)) if short and process == "scheduler" else None
        )
        return cls(lp, hp, lt, ht, dirs, heavy_rows, process, axis, kept)


def _process_to_look_in(
    light: ProfiledRun, heavy: ProfiledRun, dirs: list[Path], evidence: list[str]
) -> tuple[str | None, list[str]]:
    """The helper role to look in by CPU (None: the scheduler), and the helpers profiled in both
    runs: the busiest helper where it used more CPU than the scheduler at the task's load, or
    where what grows in the scheduler is its idle loop (it waits)."""
    sched = heavy.cores.get("scheduler")
    profiled = [r for r in HELPERS if light.helper(r) is not None and heavy.helper(r) is not None]
    busiest = max(profiled, key=lambda r: heavy.cores.get(r, 0.0), default=None)
    if sched is not None and FRONT in heavy.cores:
        evidence.append(
            f"CPU at the task's load: scheduler {sched:.2f} cores, front end (HTTP server "
            f"process) {heavy.cores[FRONT]:.2f} cores"
            + (f", detokenizer {d:.2f} cores" if (d := heavy.cores.get("detokenizer")) else "")
        )
    most = heavy.cores.get(busiest, 0.0) if busiest is not None else 0.0
    if sched is not None and most >= FRONT_MIN_CORES and most > sched:
        return busiest, profiled
    if busiest is not None and sched is not None and most >= sched / 2:
        lt, ht = _tokens(light.result), _tokens(heavy.result)
        grown = growth_entry(light.scheduler, heavy.scheduler, dirs, lt, ht)
        if grown is not None and grown[0].endswith(IDLE_LOOP):
            evidence.append(
                f"the scheduler's work that grows with the load is its idle loop ({grown[0]}, "
                f"{grown[2]:.1f}x per token): it waits, so the busiest process beside it, "
                f"the {HELPERS[busiest]}, is looked in"
            )
            return busiest, profiled
    return None, profiled


def localize(culprit: Any, profiles: Profiles, evidence: list[str]) -> tuple[Localization, bool]:
    """Where the throughput goes, and whether one place stands out: a GIL holder first, then
    the outermost function whose cost per token grows with the load, else the hottest one."""
    heavy_rows = profiles.heavy_rows
    if culprit is not None:
        full = _resolve(culprit.function, heavy_rows)
        return Localization(
            stage="scheduler process: a thread holding the GIL",
            thread=culprit.thread,
            function=full or culprit.function,
            detail=culprit.detail,
        ), True
    growing = growth_entry(
        profiles.light, profiles.heavy, profiles.dirs, profiles.light_tokens, profiles.heavy_tokens,
        near=0.5 if profiles.axis == "load" else LENGTH_NEAR, skip=IDLE_LOOP,
    )  # fmt: skip
    axis = profiles.axis
    if growing is None and profiles.short is not None:  # the model's work left out
        short, tokens = profiles.short
        growing = growth_entry(
            outside_model(short), outside_model(profiles.heavy), profiles.dirs, tokens,
            profiles.heavy_tokens, near=LENGTH_NEAR,
        )  # fmt: skip
        axis = "answer length, outside the model's forward pass"
    if growing is not None:
        where, share, ratio, others = growing
        evidence.append(f"growth with the {axis}: {where} {ratio:.1f}x per token")
        against = (
            f"{LIGHT_CONCURRENCY} requests in flight"
            if axis == "load"
            else f"answers {LENGTH_CUT}x shorter"
        )
        return Localization(
            stage=f"{_stage(profiles)}: work that grows with the {axis}",
            function=where,
            detail=f"{share:.0%} of the {profiles.process}'s samples at the task's load are in it or "
            f"its callees; its time per generated token is {ratio:.1f}x what it is with "
            f"{against} (the outermost function that grows as fast as the fastest-growing work"
            + (f"; growing as fast with it: {', '.join(others)})" if others else ")"),
        ), True
    if heavy_rows:
        top = heavy_rows[0]
        return Localization(
            stage=f"{_stage(profiles)}: the hottest SGLang function",
            function=top.where,
            detail=f"{top.self_share:.0%} of the {profiles.process}'s active samples are in this "
            f"function or the library calls it makes ({top.total_share:.0%} with callees)",
        ), top.self_share >= 0.2
    return Localization(detail="the profile saw no SGLang frames"), False


def _stage(profiles: Profiles) -> str:
    if profiles.process == "scheduler":
        return "scheduler process"
    if profiles.process == "front end":
        return "front end (HTTP server process)"
    return f"{profiles.process} process"


def growth_entry(
    light: FunctionProfile,
    heavy: FunctionProfile,
    dirs: list[Path],
    light_tokens: int,
    heavy_tokens: int,
    near: float = 0.5,
    skip: str | None = None,
) -> tuple[str, float, float, list[str]] | None:
    """Where work that grows with the load enters: of the functions holding at least
    `MIN_SHARE` of the heavy profile (with callees) whose time per token grows at least `GROWTH`
    times, those growing at least `near` times as fast as the fastest (half), the outermost (the
    most samples):
    its callers grow slower (they also do work that does not grow), its callees are parts of it.
    Returns (function, share at the task's load, growth ratio, the others that grow as fast,
    most samples first, as 'function N.Nx') or None."""
    a, b = light.inclusive(dirs), heavy.inclusive(dirs)
    floor = 1.0 / max(light_tokens, 1)  # one sample: the light profile's resolution
    ratios = {}
    for where, n in b.items():
        if n / max(heavy.samples, 1) < MIN_SHARE or (skip and where.endswith(skip)):
            continue
        per_heavy = n / max(heavy_tokens, 1)
        per_light = max(a.get(where, 0) / max(light_tokens, 1), floor)
        if per_heavy >= GROWTH * per_light:
            ratios[where] = per_heavy / per_light
    if not ratios:
        return None
    fastest = max(ratios.values())
    fast = sorted((w for w, r in ratios.items() if r >= fastest * near), key=lambda w: -b[w])
    others = [f"{w.rsplit(':', 1)[-1]} {ratios[w]:.1f}x" for w in fast[1:4]]
    return fast[0], b[fast[0]] / max(heavy.samples, 1), ratios[fast[0]], others


def _tokens(result: Any) -> int:
    return sum(r.output_tokens for r in result.records) if result is not None else 0


def _resolve(function: str | None, rows: list[FunctionTime]) -> str | None:
    """'watchdog.py:WatchdogRaw._watchdog_once' from a GIL trace -> the profile's package path."""
    if not function or ":" not in function:
        return None
    base, name = function.split(":", 1)
    for row in rows:
        if row.function == name and row.file.rsplit("/", 1)[-1] == base:
            return row.where
    return None
