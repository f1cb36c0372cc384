"""The harness of serving tasks: one SGLang server per arm, measured by a workload.

A serving task's `harness.py` subclasses `ServingHarness` and names its deployment spec:

    class TaskHarness(ServingHarness):
        deployment_path = Path(__file__).parent / "deployment.toml"

prepare(arm): refuses unknown or GPU-only knobs, builds the arm's SGLang overlay from its
    workspace copy (the task's injected fault and the arm's source patch), starts the server with the arm's knobs as server arguments,
    and warms it up. A server that fails to start raises `ServerFailed` (FAILED, with log tail).
check(arm, seed): the accuracy gate: greedy answers with top-k log-probs against the baseline
    server's answers to the same prompts (the baseline is compared with a second baseline run,
    which measures the server's own nondeterminism).
sample(arm, seed): one workload run -> {output_throughput (tok/s), ttft/tpot percentiles (ms),
    goodput, output_tokens_per_cpu_s, ...}; every request must return exactly its max_new_tokens
    (no truncation games).

One server runs at a time: whenever an arm is used, the other arm's server is paused (every
process SIGSTOPped, `Server.pause`), so the idle server (SGLang's scheduler polls without sleeping)
and anything a patched server does while it waits take no CPU from the arm being measured. A
sample that follows a switch of arms first sends `warmup_prompts` requests of the workload's
shape and discards them (caches and pages of a server that sat stopped are cold). Each sample
also reports output tokens per CPU-second of the server's processes, which contention from other
work on the machine moves less than wall-clock throughput (the task's metric `companion`).
health(arm, seed): the output health guard over a longer-output workload plus every output the
    arm produced while sampled; health_problems names each rule the candidate trips more often.
diagnose(arm): the task's throughput, and where the server spends its time, from a GIL trace
    and function profiles of the scheduler process (`serving/diagnosis.py`).

The server runs as a process on this machine, in its own network namespace (loopback only: patched
SGLang code reaches neither the network nor the host's services; `serving/netns.py`), and every
request goes through `Server.call`; the evidence's health table names the server's network
(`server_network`: isolated, or host with the reason) and file view (`server_filesystem`:
confined under bubblewrap, or host with the reason; `serving/fileview.py`). The arm's sandbox
provides its patched workspace copy. Params (task.toml [params]): num_prompts, input_len,
output_len, max_concurrency (0: all at once), request_rate (0: all at once), api,
health_prompts, health_output_len, gate_prompts, gate_output_len, temperature, warmup_prompts
(0: none), pause_idle_arm (false: both servers run all the time, e.g. where a paused server
would miss a collective's timeout).
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, ClassVar

from infra_agent.feedback.health import HealthReport, compare_health, score_outputs
from infra_agent.serving import knobs as knob_catalogue
from infra_agent.serving.accuracy import Answer, GateConfig, answer, compare_answers, gate_prompts
from infra_agent.serving.datasets import Session, random_sessions
from infra_agent.serving.deployment import DeploymentSpec, load_deployment
from infra_agent.serving.metrics import summarize
from infra_agent.serving.overlay import build_overlay
from infra_agent.serving.server import Server, ServerFailed, gpu_count, has_gpu
from infra_agent.serving.tiny_model import VOCAB_SIZE
from infra_agent.serving.workload import LoadSpec, RequestRecord, run_workload
from infra_agent.tasks.harness import Arm, CheckResult, Harness, IncorrectOutput
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
    "health_prompts": 32,
    "health_output_len": 160,
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
        self.references: dict[int, list[Answer]] = {}
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
        arm.state["server"] = Server.start(
            self.deployment, workdir, knobs=args, overlay=overlay, model_cache=workdir / "models"
        )
        arm.state["outputs"] = []
        self.arms[arm.name] = arm
        self.active = arm.name
        # Warm-up: first requests pay for lazy initialisation.
        self.server(arm).call(
            run_workload,
            random_sessions(8, 16, 8, vocab_size=self.vocab, seed=1),
            self.load(seed=1),
        )

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
        return LoadSpec(
            api=self.params["api"],
            max_concurrency=conc or None,
            request_rate=rate if rate > 0 else math.inf,
            temperature=float(self.params["temperature"]),
            seed=seed % (2**31),
        )

    # -- the four questions ------------------------------------------------------------------

    def check(self, arm: Arm, seed: int) -> CheckResult:
        prompts = gate_prompts(self.gate, vocab_size=self.vocab, seed=seed)
        mine = self.server(arm).call(answer, prompts, self.gate)
        if seed not in self.references:
            self.references[seed] = self.server(self.arms["baseline"]).call(
                answer, prompts, self.gate
            )
        result = compare_answers(self.references[seed], mine, self.gate)
        return CheckResult(
            passed=result.passed,
            max_abs_err=result.max_tv,
            tolerance=f"top-{self.gate.top_k} TV <= {self.gate.max_tv}, token flips only at margins <= {self.gate.max_flip_margin} nats",
            detail=result.render() if not result.passed else None,
        )

    def sample(self, arm: Arm, seed: int) -> dict[str, float]:
        p = self.params
        switched = self.active != arm.name
        server = self.server(arm)
        if switched and int(p["warmup_prompts"]) > 0:
            warm = self.sessions(int(p["warmup_prompts"]), seed=seed ^ 0x5EED)
            server.call(run_workload, warm, self.load(seed ^ 0x5EED))
        sessions = self.sessions(int(p["num_prompts"]), seed=seed)
        cpu_before = server.cpu_seconds()
        result = server.call(run_workload, sessions, self.load(seed))
        result.server_cpu_s = server.cpu_seconds() - cpu_before
        _verify(result.records, [t.output_len for s in sessions for t in s.turns])
        arm.state["outputs"].extend(result.records)
        return summarize(result).sample()

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
            f"; {p['warmup_prompts']} warm-up requests when a server resumes",
            params=dict(p),
            knobs=dict(knobs),
            seeds="fresh prompts from an unseen seed for every sample; the accuracy gate uses "
            f"{p['gate_prompts']} fresh prompts per check, answered by both servers",
            metric=f"{self.manifest.metric.name} [{self.manifest.metric.unit}] over the sample",
        )

    def sessions(self, prompts: int, *, seed: int) -> list[Session]:
        """`prompts` single-turn sessions of the task's workload shape."""
        p = self.params
        return random_sessions(
            prompts, int(p["input_len"]), int(p["output_len"]), vocab_size=self.vocab, seed=seed
        )

    def health(self, arm: Arm, seed: int) -> dict[str, float | int | str | bool]:
        p = self.params
        sessions = random_sessions(
            int(p["health_prompts"]),
            int(p["input_len"]),
            int(p["health_output_len"]),
            vocab_size=self.vocab,
            range_ratio=0.0,
            seed=seed,
        )
        result = self.server(arm).call(run_workload, sessions, self.load(seed))
        records: list[RequestRecord] = list(arm.state.get("outputs", [])) + result.records
        report = self.score(records)
        arm.state["health_report"] = report
        server = self.server(arm)
        return {
            **report.as_health(),
            "server_network": server.network.render(),
            "server_filesystem": server.filesystem.render(),
        }

    @staticmethod
    def score(records: list[RequestRecord]) -> HealthReport:
        return score_outputs((r.text, r.output_ids, r.meta) for r in records if r.success)

    def health_problems(
        self,
        baseline: dict[str, float | int | str | bool],
        candidate: dict[str, float | int | str | bool],
    ) -> list[str]:
        return compare_health(baseline, candidate)

    def diagnose(self, arm: Arm) -> Any:
        """Throughput and where the server spends it: GIL trace and profiles of the scheduler
        under the task's load (`serving.diagnosis`)."""
        from infra_agent.serving.diagnosis import diagnose_throughput

        return diagnose_throughput(self, arm)


def _verify(records: list[RequestRecord], wanted: list[int]) -> None:
    """Every request succeeded and returned exactly the tokens it asked for."""
    failed = [r for r in records if not r.success]
    if failed:
        raise IncorrectOutput(
            f"{len(failed)}/{len(records)} requests failed; first: {failed[0].error}"
        )
    by_order = sorted(records, key=lambda r: (r.session, r.turn))
    for r, n in zip(by_order, wanted, strict=False):
        if r.output_tokens != n:
            raise IncorrectOutput(
                f"request {r.session} returned {r.output_tokens} tokens, asked for {n}"
            )
