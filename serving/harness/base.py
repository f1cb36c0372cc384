"""The harness of serving tasks: one SGLang server per arm, measured by a workload.

A serving task's `harness.py` subclasses `ServingHarness` and names its deployment spec:

    class TaskHarness(ServingHarness):
        deployment_path = Path(__file__).parent / "deployment.toml"

prepare(arm): refuses unknown or GPU-only knobs, builds the arm's SGLang overlay from its
    workspace copy (the task's injected fault and the arm's source patch), starts the server with the arm's knobs as server arguments,
    and warms it up. A server that fails to start raises `ServerFailed` (FAILED, with log tail).
check(arm, seed): the accuracy gate, on the measured workload's own requests: one run of exactly
    what a sample of `seed` sends (same API, streaming, temperature, lengths, warm-up; nothing
    tells a judged request from a measured one). The candidate's outputs are judged against the
    baseline's answers to the same prompts by their likelihood under the baseline server
    (`serving.harness.answers`, `serving.harness.accuracy`: teacher-forced log-probs, a
    signed-rank test over up to `judge_check_prompts` prompt pairs; the baseline may receive
    scoring requests, the candidate never does).
sample(arm, seed): one workload run -> {output_throughput (tok/s), ttft/tpot percentiles (ms),
    goodput, output_tokens_per_cpu_s, ...}. The client counts: output tokens are the token ids
    each stream carried; every request must return exactly its max_new_tokens (no truncation
    games) and a server that claims other counts than it sent (`completion_tokens`) is INCORRECT.
    The outputs are kept per seed (both arms get the same prompts for a seed).

One server runs at a time: whenever an arm is used, the other arm's server is paused (every
process SIGSTOPped, `Server.pause`), so the idle server (SGLang's scheduler polls without sleeping)
and anything a patched server does while it waits take no CPU from the arm being measured. Every
measured run starts from the same state, whichever arm ran before and whatever its server served
since its last run (the baseline also answers the judge's scoring requests): its server is
paused, resumed, and sent `warmup_prompts` requests of the workload's shape, which are discarded
(caches and pages of a server that sat stopped are cold). Both runs of a pair (one seed) start on
the same CPU, the CPUs taking turns from pair to pair (`Server.placed_on`, held through the
warm-up): a busy server keeps the core it first got for its whole life, and the cores of a shared
VM differ (what else runs there, the host's own speed), so one arm's server could otherwise keep
the better core for a whole experiment (A/A experiments leaned up to 8% either way). Each sample
also reports output tokens per CPU-second of the server's processes, which contention from other
work on the machine moves less than wall-clock throughput (the task's metric `companion`).
health(arm, seed): the output health guard over every output the arm produced in checks and
    samples (no requests of its own, so none a patch could tell apart); for the candidate also the
    likelihood test over up to `judge_prompts` prompt pairs drawn at random from all of them.
    health_problems names each rule the candidate trips more often, and a failed likelihood test.
diagnose(arm): the task's throughput, and where the server spends its time, from a GIL trace
    and function profiles of the scheduler process (`serving/instruments/diagnosis.py`).

The server runs as a process on this machine, in its own network namespace (loopback only: patched
SGLang code reaches neither the network nor the host's services; `serving/netns.py`), and every
request goes through `Server.call`; the evidence's health table names the server's network
(`server_network`: isolated, or host with the reason) and file view (`server_filesystem`:
confined under bubblewrap, or host with the reason; `serving/fileview.py`). The arm's sandbox
provides its patched workspace copy, and only that: the experiment's sandbox evidence states the
candidate server's confinement (`code_confinement`: 'server:bwrap', what was in force, what was
missing), which is what the patch ran under. Params (task.toml [params]): num_prompts, input_len,
output_len, max_concurrency (0: all at once), request_rate (0: all at once), api, temperature,
top_logprobs_num and return_text_in_logprobs (optional: every request asks for its tokens'
log-probs and the top N alternatives, as scoring and RL rollout clients do), warmup_prompts (0: none), judge_prompts, judge_check_prompts, judge_alpha (the likelihood
test's false-alarm rate), gate_prompts and gate_output_len (the prompt set of accuracy tasks'
`answer`), pause_idle_arm (false: both servers run all the time, e.g. where a paused server
would miss a collective's timeout).
"""

from __future__ import annotations

import math
import os
import random
import shutil
from pathlib import Path
from typing import Any, ClassVar

from infra_agent.feedback.health import HealthReport, compare_health, score_outputs
from infra_agent.serving import knobs as knob_catalogue
from infra_agent.serving.deployment import DeploymentSpec, load_deployment
from infra_agent.serving.harness.accuracy import (
    DEFAULT_ALPHA,
    GateConfig,
    LikelihoodTest,
    score_on_baseline,
)
from infra_agent.serving.harness.answers import likelihood_test, verify_counts
from infra_agent.serving.launch import gpu_count, has_gpu
from infra_agent.serving.load.datasets import Session, random_sessions
from infra_agent.serving.load.generator import LoadSpec, RequestRecord, WorkloadResult, run_workload
from infra_agent.serving.load.metrics import summarize
from infra_agent.serving.overlay import build_overlay
from infra_agent.serving.server import Server, ServerFailed
from infra_agent.serving.tiny_model import VOCAB_SIZE
from infra_agent.tasks.harness import Arm, CheckResult, Harness
from infra_agent.tasks.manifest import TaskManifest
from infra_agent.tasks.workload import Workload

DEFAULT_PARAMS: dict[str, Any] = {
    "num_prompts": 128,
    "input_len": 64,
    "output_len": 32,
    "max_concurrency": 0,
    "request_rate": 0.0,
    "api": "generate",
    "temperature": 1.0,
    "judge_prompts": 256,
    "judge_check_prompts": 64,
    "judge_alpha": DEFAULT_ALPHA,
    "gate_prompts": 8,
    "gate_output_len": 24,
    "vocab_size": VOCAB_SIZE,
    "warmup_prompts": 16,
    "pause_idle_arm": True,
}


class ServingHarness(Harness):
    deployment_path: ClassVar[Path]
    """The task's deployment.toml (set by the subclass)."""

    def __init__(self, manifest: TaskManifest, params: dict[str, Any]) -> None:
        super().__init__(manifest, {**DEFAULT_PARAMS, **params})
        self.deployment: DeploymentSpec = load_deployment(self.deployment_path)
        self.arms: dict[str, Arm] = {}
        self.active: str | None = None
        """The arm whose server runs (the others' are paused)."""
        self.scored: dict[tuple[str, tuple[int, int]], float] = {}
        """(arm, (seed, session)) -> mean log-probability per output token under the baseline."""
        self.cores: dict[int, int] = {}
        """Seed -> the CPU its measured runs start on (`core`)."""
        self.gate = GateConfig(
            prompts=int(self.params["gate_prompts"]), output_len=int(self.params["gate_output_len"])
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def server_args(self, arm: Arm) -> dict[str, Any]:
        """The arm's knobs as server arguments, refused before any start if unknown or GPU-only."""
        knobs = dict(arm.knobs)
        knob_catalogue.check_device(
            knobs, self.manifest.knobs, gpu=has_gpu() or self.deployment.needs_gpu
        )
        knob_catalogue.check_flags(knobs, self.deployment.sglang_version)
        return knobs

    @staticmethod
    def overlay_files(workspace: Path) -> list[str]:
        """The SGLang files in the arm's (sparse) workspace: the task's injected modules and the
        ones its patch touches."""
        folder = workspace / "sglang"
        if not folder.is_dir():
            return []
        return sorted(
            p.relative_to(workspace).as_posix()
            for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )

    def prepare(self, arm: Arm) -> None:
        if self.deployment.gpus > gpu_count():
            raise ServerFailed(
                f"deployment needs {self.deployment.gpus} GPU(s), this machine has {gpu_count()}: "
                "GPU-only deployment skipped",
                kind="crash",
            )
        args = self.server_args(arm)
        # Inside the arm's sandbox folder: removed with the sandbox, also on SIGTERM.
        workdir = Path(arm.sandbox.root) / ".serving"
        workdir.mkdir(parents=True, exist_ok=True)
        arm.state["workdir"] = workdir
        workspace = arm.sandbox.root
        overlay = build_overlay(
            workspace,
            self.overlay_files(workspace),
            workdir / "overlay",
            self.deployment.sglang_version,
        )
        arm.state["overlay"] = overlay
        self.activate(None)  # the other arm's server must not slow this start
        models = workdir / "models"
        try:
            arm.state["server"] = Server.start(
                self.deployment, workdir, knobs=args, overlay=overlay, model_cache=models
            )
        except ServerFailed as exc:  # its code ran (and failed) under this confinement
            arm.state["confinement"] = getattr(exc, "confinement", None)
            raise
        arm.state["runs"] = {}  # seed -> the records of its measured run
        self.arms[arm.name] = arm
        self.active = arm.name
        # Warm-up: first requests pay for lazy initialisation (the workload's shape, as all are).
        seed = self.warmup_seeds[0]
        self.server(arm).call(run_workload, self.sessions(8, seed=seed), self.load(seed))

    def finish(self, arm: Arm) -> None:
        server = arm.state.pop("server", None)
        if server is not None:
            server.stop()
        workdir = arm.state.pop("workdir", None)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)

    def server(self, arm: Arm) -> Server:
        """The arm's running server, made the active one (the other arm's is paused)."""
        server: Server | None = arm.state.get("server")
        if server is None:
            raise RuntimeError(f"{arm.name}: no server (prepare was not run)")
        if not server.alive():
            raise ServerFailed(
                f"{arm.name}: the server died", kind="crash", log_tail=server.log_tail()
            )
        self.activate(arm.name)
        return server

    def activate(self, name: str | None) -> None:
        """Resume arm `name`'s server and pause every other (None: pause all), when
        `pause_idle_arm` is on."""
        if not self.params["pause_idle_arm"]:
            self.active = name
            return
        for other, arm in self.arms.items():
            server: Server | None = arm.state.get("server")
            if server is not None and other != name:
                server.pause()
        if name is not None:
            self.arms[name].state["server"].resume()
        self.active = name

    @property
    def vocab(self) -> int:
        return int(self.params["vocab_size"])

    def load(self, seed: int) -> LoadSpec:
        conc = int(self.params["max_concurrency"])
        rate = float(self.params["request_rate"])
        top = self.params.get("top_logprobs_num")
        return LoadSpec(
            api=self.params["api"],
            max_concurrency=conc or None,
            request_rate=rate if rate > 0 else math.inf,
            temperature=float(self.params["temperature"]),
            seed=seed % (2**31),
            return_logprob=top is not None,
            top_logprobs_num=int(top or 0),
            return_text_in_logprobs=bool(self.params.get("return_text_in_logprobs", False)),
            incremental=bool(
                self.deployment.server_args.get("incremental-streaming-output", False)
            ),
        )

    # -- the four questions ------------------------------------------------------------------

    def check(self, arm: Arm, seed: int) -> CheckResult:
        self.measured(arm, seed)
        alpha = float(self.params["judge_alpha"])
        tolerance = (
            "outputs as likely under the baseline model as the baseline's own answers to the same "
            f"prompts (two-sided signed-rank test over prompt pairs, alpha {alpha:g})"
        )
        compared = (
            "the token ids each server returned for the same prompts (one measured sample), "
            "every output token scored by its log-prob under the baseline server"
        )
        if arm.name == "baseline":
            return CheckResult(passed=True, tolerance=tolerance, compared=compared)
        base = self.arms["baseline"]
        if seed not in base.state["runs"]:
            self.measured(base, seed)
        test = self.judge([seed], int(self.params["judge_check_prompts"]), random.Random(seed))
        return CheckResult(
            passed=test.passed,
            tolerance=tolerance,
            compared=compared,
            detail=None if test.passed else test.render(),
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        return summarize(self.measured(arm, seed)).sample()

    def measured(self, arm: Arm, seed: int) -> WorkloadResult:
        """One run of the measured workload for `seed`, its token counts verified, its outputs
        kept. Every run is prepared alike (an arm measured twice in a row, or after scoring
        requests, is not spared a step): the server paused and resumed, then a warm-up of the
        workload's shape with the server held on the seed's CPU (`core`)."""
        p = self.params
        self.activate(None)
        server = self.server(arm)
        with server.placed_on(self.core(seed)):
            if int(p["warmup_prompts"]) > 0:
                warm = self.sessions(int(p["warmup_prompts"]), seed=seed ^ 0x5EED)
                server.call(run_workload, warm, self.load(seed ^ 0x5EED))
        sessions = self.sessions(int(p["num_prompts"]), seed=seed)
        cpu_before = server.cpu_seconds()
        result = server.call(run_workload, sessions, self.load(seed))
        result.server_cpu_s = server.cpu_seconds() - cpu_before
        verify_counts(result.records, sessions)
        arm.state["runs"][seed] = result.records
        return result

    def core(self, seed: int) -> int:
        """The CPU on which both arms' runs of `seed` start: the next of this machine's CPUs, in
        turn, the first time a seed is measured, the same for the other arm's run of it."""
        if seed not in self.cores:
            usable = sorted(os.sched_getaffinity(0))
            self.cores[seed] = usable[len(self.cores) % len(usable)]
        return self.cores[seed]

    def judge(self, seeds: list[int], limit: int, rng: random.Random) -> LikelihoodTest:
        """The likelihood test over up to `limit` prompts (sessions) drawn by `rng` from the runs
        of `seeds` both arms answered, every output scored by the baseline server (once: a
        session's score is kept for later tests)."""
        base = self.arms["baseline"]
        return likelihood_test(
            {name: arm.state["runs"] for name, arm in self.arms.items()},
            seeds, limit, rng, self.scored, alpha=float(self.params["judge_alpha"]),
            score=lambda items: score_on_baseline(self.server(base), items),
        )  # fmt: skip

    def workload(self, knobs: dict[str, Any]) -> Workload:
        """The load each timed sample sends (no ready setup: the server is the code)."""
        p = self.params
        conc = int(p["max_concurrency"])
        rate = float(p["request_rate"])
        return Workload(
            summary=f"{p['num_prompts']} requests of {p['input_len']} random tokens -> "
            f"{p['output_len']} tokens via /{p['api']}, "
            f"{f'at most {conc} in flight' if conc else 'all in flight'}, "
            f"{f'{rate:g} req/s' if rate > 0 else 'sent at once'}, temperature {p['temperature']}"
            f"{self._logprob_asks()}"
            f"; {p['warmup_prompts']} warm-up requests before every measured run",
            params=dict(p),
            knobs=dict(knobs),
            seeds="fresh prompts from an unseen seed for every sample; the accuracy check is one "
            "more sample's run on a fresh seed, answered by both servers, the outputs scored "
            "under the baseline",
            metric=f"{self.manifest.metric.name} [{self.manifest.metric.unit}] over the sample",
        )

    def _logprob_asks(self) -> str:
        """What each request asks for besides its tokens (params `top_logprobs_num`,
        `return_text_in_logprobs`: the request shape of scoring and rollout clients)."""
        top = self.params.get("top_logprobs_num")
        if top is None:
            return ""
        text = " and their text" if self.params.get("return_text_in_logprobs") else ""
        return f"; every request asks for the logprob of each output token, its top {top} alternatives{text}"

    def sessions(self, prompts: int, *, seed: int) -> list[Session]:
        """`prompts` single-turn sessions of the task's workload shape."""
        p = self.params
        return random_sessions(
            prompts, int(p["input_len"]), int(p["output_len"]), vocab_size=self.vocab, seed=seed
        )

    def health(self, arm: Arm, seed: int) -> dict[str, float | int | str | bool]:
        records = [r for run in arm.state.get("runs", {}).values() for r in run]
        report = self.score(records)
        arm.state["health_report"] = report
        found: dict[str, float | int | str | bool] = dict(report.as_health())
        if arm.name == "candidate" and "baseline" in self.arms:
            seeds = sorted(set(arm.state["runs"]) & set(self.arms["baseline"].state["runs"]))
            test = self.judge(seeds, int(self.params["judge_prompts"]), random.Random(seed))
            found |= {
                "likelihood_pairs": test.pairs,
                "likelihood_baseline_nats": round(test.baseline_nats, 4),
                "likelihood_candidate_nats": round(test.candidate_nats, 4),
                "likelihood_z": round(test.z, 2),
                "likelihood_p": test.p_value,
                "likelihood_passed": test.passed,
                "likelihood": test.render(),
            }
        server = self.server(arm)
        return {
            **found,
            "server_network": server.network.render(),
            "server_filesystem": server.filesystem.render(),
            "server_confinement": server.confinement.render() if server.confinement else "none",
        }

    def code_confinement(self, arm: Arm) -> tuple[list[str], list[str]] | None:
        """What confined the arm's code (the experiment's sandbox evidence): its server's
        confinement; a server that did not start says so."""
        server: Server | None = arm.state.get("server")
        record = server.confinement if server is not None else arm.state.get("confinement")
        if record is None:
            return [], ["server confinement unknown: no server was started"]
        return record.as_evidence()

    @staticmethod
    def score(records: list[RequestRecord]) -> HealthReport:
        return score_outputs((r.text, r.output_ids, r.meta) for r in records if r.success)

    def health_problems(
        self,
        baseline: dict[str, float | int | str | bool],
        candidate: dict[str, float | int | str | bool],
    ) -> list[str]:
        problems = compare_health(baseline, candidate)
        if candidate.get("likelihood_passed") is False:
            problems.append(str(candidate["likelihood"]))
        return problems

    def diagnose(self, arm: Arm) -> Any:
        """Throughput and where the server spends it: GIL trace and profiles of the scheduler
        under the task's load (`serving.instruments.diagnosis`)."""
        from infra_agent.serving.instruments.diagnosis import diagnose_throughput

        return diagnose_throughput(self, arm)
