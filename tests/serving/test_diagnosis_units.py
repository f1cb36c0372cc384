"""The serving diagnosis instruments on real processes and real traces, without a server: the
function profile (py-spy on a live child), the precision audit (torch.profiler on real ops in a
module laid out like SGLang's), and the log-probability distance."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from infra_agent.feedback.pyprofile import profile_pid
from infra_agent.serving.harness.accuracy import Answer
from infra_agent.serving.harness.logprobs import logprob_distance
from infra_agent.serving.instruments.precision import findings, qualified

SAMPLER = textwrap.dedent(
    """
    import torch


    class Sampler:
        def forward(self, logits, reduced):
            logits = logits.float()
            probs = torch.softmax(logits, dim=-1)
            if reduced:
                probs = probs.to(torch.bfloat16)
            return torch.log(probs)


    def model(hidden, weight, reduced):
        logits = hidden.to(torch.bfloat16) @ weight  # the model's dtype
        return Sampler().forward(logits, reduced)
    """
)


@pytest.fixture
def fake_package(tmp_path: Path) -> Path:
    module = tmp_path / "sglang" / "srt" / "layers" / "fake_sampler.py"
    module.parent.mkdir(parents=True)
    for folder in (module.parent, module.parent.parent, module.parent.parent.parent):
        (folder / "__init__.py").write_text("")
    module.write_text(SAMPLER)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path / "sglang"
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


def trace(reduced: bool, tmp: Path) -> list[dict]:
    import json

    from torch.profiler import ProfilerActivity, profile

    mod = importlib.import_module("sglang.srt.layers.fake_sampler")
    hidden, weight = torch.randn(4, 16), torch.randn(16, 1024).to(torch.bfloat16)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, record_shapes=True) as prof:
        mod.model(hidden, weight, reduced)
    path = tmp / f"trace-{reduced}.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_precision_audit_names_the_function_that_drops_to_16_bits(
    fake_package: Path, tmp_path: Path
) -> None:
    clean = findings(trace(False, tmp_path), vocab=1024)
    assert clean == []  # the bf16 matmul (the LM head) is by design, not a finding
    found = findings(trace(True, tmp_path), vocab=1024)
    assert found[0].op == "aten::to" and found[0].input_type == "float"
    assert any(f.op.startswith("aten::log") for f in found)
    first = found[0]
    assert first.function.startswith("sglang/srt/layers/fake_sampler.py(")
    assert qualified(first.function, [fake_package]) == (
        "sglang/srt/layers/fake_sampler.py:Sampler.forward"
    )


def test_function_profile_charges_library_time_to_the_workspace_function(tmp_path: Path) -> None:
    work = tmp_path / "pkg"
    work.mkdir()
    (work / "busy.py").write_text(
        "import random\n"
        "data = [random.random() for _ in range(200000)]\n"
        "def hot():\n    return sorted(data)\n"  # time in C, charged to hot()
        "def cold():\n    return sorted(data[:5000])\n"
        "while True:\n    hot()\n    cold()\n"
    )
    child = subprocess.Popen([sys.executable, str(work / "busy.py")])
    try:
        time.sleep(0.5)
        profile = profile_pid(child.pid, duration_s=2.0)
    finally:
        child.kill()
        child.wait()
    rows = profile.functions([work])
    assert profile.samples > 20
    assert rows[0].function == "hot" and rows[0].file == "pkg/busy.py"
    assert rows[0].self_share > 0.6
    assert rows[1].function in ("cold", "<module>") and rows[1].self_share < 0.3
    assert "hot" in profile.render([work])


def test_a_workload_shorter_than_py_spys_attach_is_still_profiled(tmp_path: Path) -> None:
    """The profiled work starts once py-spy samples: before, a workload that ended before py-spy
    attached (0.9 s on sglang-cpu-tiny's task load) stopped it with a Ctrl-C that left no file,
    and `tasks check sglang-cpu-tiny` ended on "py-spy cannot record pid ...: no output"."""
    from infra_agent.feedback.pyprofile import profile_while

    work = tmp_path / "pkg"
    work.mkdir()
    (work / "spin.py").write_text(
        "def spin():\n    return sum(range(10**5))\nwhile True:\n    spin()\n"
    )
    child = subprocess.Popen([sys.executable, str(work / "spin.py")])
    started: list[float] = []
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        profile, result = profile_while(
            child.pid, lambda: started.append(time.monotonic()) or "done", rate=100
        )
    finally:
        child.kill()
        child.wait()
    # Before, this raised PySpyUnavailable: the work was over before py-spy attached.
    assert result == "done" and profile.samples >= 0
    assert started and started[0] > t0


def test_logprob_distance_compares_up_to_the_first_divergence() -> None:
    ref = [Answer(ids=[1, 2, 3], top=[{1: -0.1, 5: -2.0}, {2: -0.2}, {3: -0.3}])]
    same = logprob_distance(ref, ref)
    assert same.mean_nats == 0.0 and same.pairs == 4
    moved = [Answer(ids=[1, 9, 3], top=[{1: -0.11, 5: -2.0}, {2: -0.25}, {3: -9.0}])]
    d = logprob_distance(moved, ref)
    # Positions 0 and 1 (where the tokens part) are compared; position 2 is not.
    assert d.pairs == 3 and d.max_nats == pytest.approx(0.05)


def test_growth_entry_names_where_work_that_grows_with_the_load_enters(tmp_path: Path) -> None:
    from infra_agent.feedback.pyprofile import FunctionProfile
    from infra_agent.serving.instruments.diagnosis import growth_entry

    root = tmp_path / "sglang"
    f = str(root / "srt" / "sched.py")

    def stack(*names: str) -> str:
        return "thread (1): MainThread;" + ";".join(f"{n} ({f}:1)" for n in names)

    loop, step, prio, match = "Loop.run", "Loop.step", "Policy.calc_priority", "Policy._matches"
    light = FunctionProfile(pid=1, duration_s=1, samples=100, stacks={
        stack(loop, step, "Model.forward"): 97, stack(loop, step, prio): 1,
        stack(loop, step, prio, match): 2,
    })  # fmt: skip
    heavy = FunctionProfile(pid=1, duration_s=1, samples=1000, stacks={
        stack(loop, step, "Model.forward"): 400, stack(loop, step, prio): 50,
        stack(loop, step, prio, match): 550,
    })  # fmt: skip
    # 1000 tokens each: the model's time per token grows 4x, the policy's 200x, its matching
    # 275x: the policy is where the growing work enters (its callers also do work that does not).
    found = growth_entry(light, heavy, [root], light_tokens=1000, heavy_tokens=1000)
    assert found is not None
    where, share, ratio, others = found
    assert where == "sglang/srt/sched.py:Policy.calc_priority" and others == [
        "Policy._matches 275.0x"
    ]
    assert share == pytest.approx(0.6) and ratio == pytest.approx(200.0)
    flat = FunctionProfile(pid=1, duration_s=1, samples=100, stacks=dict(light.stacks))
    assert growth_entry(light, flat, [root], light_tokens=1000, heavy_tokens=1000) is None


def test_the_experiment_workers_own_frames_are_never_a_profiles_answer(tmp_path: Path) -> None:
    """A sandbox copy holds the worker's files beside the task's code: a pd-kv-reuse-race
    diagnosis once named the worker's frame reader (seen only in the run with aborts)."""
    from infra_agent.feedback.pyprofile import FunctionProfile, growing_function

    root = tmp_path / "ws"
    mine, worker = str(root / "decode.py"), str(root / "_infra_rpc_codec.py")
    quiet = FunctionProfile(pid=1, duration_s=1, samples=10, stacks={
        f"thread (1): MainThread;serve ({mine}:1)": 10,
    })  # fmt: skip
    loaded = FunctionProfile(pid=1, duration_s=1, samples=40, stacks={
        f"thread (1): MainThread;serve ({mine}:1)": 10,
        f"thread (1): MainThread;read_frame_bytes ({worker}:1)": 20,
        f"thread (1): MainThread;serve ({mine}:1);abort ({mine}:9)": 10,
    })  # fmt: skip
    assert "ws/_infra_rpc_codec.py:read_frame_bytes" not in loaded.inclusive([root])
    assert all(row.file == "ws/decode.py" for row in loaded.functions([root]))
    found = growing_function(quiet, loaded, [root], low_units=10, high_units=10)
    assert found is not None and found[0] == "ws/decode.py:abort"


def test_a_function_in_a_handful_of_samples_is_not_where_only_aborts_go(tmp_path: Path) -> None:
    """pd-kv-reuse-race's differential profile, replayed: a suite run named
    PrefillNode.__init__ (once in each run; 3 samples with aborts, none without). Named only
    when chance could not split the samples so (below 1 in 10,000: 14 to none here)."""
    from infra_agent.feedback.pyprofile import FunctionProfile, function_only_in

    root = tmp_path / "ws"
    decode, prefill = str(root / "decode.py"), str(root / "prefill.py")
    serve = f"thread (1): MainThread;serve ({decode}:1)"

    def profile(**extra: int) -> FunctionProfile:
        stacks = {serve: 200}
        for name, count in extra.items():
            where = prefill if name == "init" else decode
            stacks[f"{serve};{name} ({where}:9)"] = count
        return FunctionProfile(pid=1, duration_s=1, samples=sum(stacks.values()), stacks=stacks)

    n = 10_000
    for init in (3, 13):
        assert (
            function_only_in(profile(), profile(init=init), [root], low_units=n, high_units=n)
            is None
        )
    found = function_only_in(profile(), profile(abort=14), [root], low_units=n, high_units=n)
    assert found is not None and found[0] == "ws/decode.py:abort"
    # A function that runs in both, only more often with aborts (retried work), is not named.
    assert (
        function_only_in(profile(abort=10), profile(abort=40), [root], low_units=n, high_units=n)
        is None
    )


def test_a_dropped_profiled_request_is_a_failed_audit_not_a_crash(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """sglang-real-rollout-logprob-mismatch's server dropped the precision audit's profiled
    request (httpx.RemoteProtocolError), which ended the whole `diagnose`."""
    import httpx

    from infra_agent.serving.instruments import precision

    def dropped(harness: object, arm: object) -> list[dict[str, object]]:
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

    monkeypatch.setattr(precision, "record_trace", dropped)
    audit = precision.audit_sampling_precision(object(), object())
    assert audit.evidence == [
        "precision audit failed: RemoteProtocolError: Server disconnected without sending a response."
    ]
    assert audit.localization.detail.startswith("no precision audit: RemoteProtocolError")
    # What the server's log says about it is brought into the evidence.
    from types import SimpleNamespace

    log = "INFO: step\nTraceback (most recent call last):\n  x\nRuntimeError: profiler died\n"
    server = SimpleNamespace(log_tail=lambda n: log)
    audit = precision.audit_sampling_precision(SimpleNamespace(server=lambda arm: server), None)
    assert audit.evidence[1:] == [
        "  server log: Traceback (most recent call last):",
        "  server log: RuntimeError: profiler died",
    ]


def test_the_diagnosis_sends_the_tasks_own_requests(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A task whose harness shapes its requests (sglang-open-cpu-shared-prompt: the same long
    instructions before every message) is traced and profiled with those requests, not with
    random prompts of its `input_len` (which had profiled a workload the task never sends)."""
    from types import SimpleNamespace

    from infra_agent.serving.instruments import diagnosis
    from infra_agent.serving.load.datasets import Session, Turn
    from infra_agent.serving.load.generator import LoadSpec

    own = [Session(turns=[Turn(new_ids=[5] * 300, output_len=4)])]
    sent: list[object] = []

    class Harness:
        params = {"num_prompts": 1, "input_len": 8, "output_len": 4, "max_concurrency": 0}

        def sessions(self, prompts: int, *, seed: int) -> list[Session]:
            return own

        def load(self, seed: int) -> LoadSpec:
            return LoadSpec(seed=seed)

        def server(self, arm: object) -> None:
            return None

    def traced(server, sessions, load, processes, **_):  # type: ignore[no-untyped-def]
        sent.append(sessions)
        trace = SimpleNamespace(profile=object(), gil=None, errors=["no GIL trace"], cpu_s=None)
        return tuple(trace for _ in processes), None

    monkeypatch.setattr(diagnosis, "trace_during", traced)
    diagnosis.profiled_run(Harness(), None, 1, concurrency=4, prompts=1)
    diagnosis.gil_culprit(Harness(), None, [], [])
    assert sent == [own, own]


def _looked_in(monkeypatch, root: Path, runs, params=None):  # type: ignore[no-untyped-def]
    """`Profiles.measure` then `localize` on stub runs: `runs(heavy)` (or `runs(heavy, cut)` with
    `output_len` in `params`) gives a run's scheduler and front-end samples by function (files
    sglang/scheduler.py, sglang/front.py), its cores (and CPU-seconds), and optionally the
    detokenizer's samples (sglang/detok.py). Returns (profiles, localization, strong, evidence)."""
    from types import SimpleNamespace

    from infra_agent.feedback.pyprofile import FunctionProfile
    from infra_agent.serving.instruments import diagnosis

    def profile(file: str, counts: dict[str, int]) -> FunctionProfile:
        stacks = {
            "thread (1): MainThread;" + ";".join(f"{f} ({root / file}:3)" for f in n.split(";")): k
            for n, k in counts.items()
        }  # 'a;b': b called by a
        return FunctionProfile(pid=1, duration_s=1, samples=sum(counts.values()), stacks=stacks)

    def run(harness, arm, seed, *, concurrency, prompts, cut=1):  # type: ignore[no-untyped-def]
        heavy = concurrency is None
        sched, front, cores, *detok = runs(heavy, cut) if params else runs(heavy)
        return diagnosis.ProfiledRun(
            scheduler=profile("scheduler.py", sched), front=profile("front.py", front),
            result=SimpleNamespace(records=[SimpleNamespace(output_tokens=1000)]), cpu_s=cores,
            wall_s=1.0, detokenizer=profile("detok.py", detok[0]) if detok else None,
        )  # fmt: skip

    monkeypatch.setattr(diagnosis, "profiled_run", run)
    monkeypatch.setattr(diagnosis, "package_dirs", lambda harness, arm: [root])
    monkeypatch.setattr(diagnosis, "describe", lambda result: "1000 tokens")
    harness = SimpleNamespace(
        params={"num_prompts": 64, "max_concurrency": 0, "output_len": 32} | (params or {})
    )
    evidence: list[str] = []
    profiles = diagnosis.Profiles.measure(harness, None, evidence, [])
    found, strong = diagnosis.localize(None, profiles, evidence)
    return profiles, found, strong, evidence


def test_the_front_end_is_looked_in_when_it_used_more_cpu_than_the_scheduler(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Faults in request handling run in the HTTP server's process (sglang-real-scored-stream's
    per-token logprob work): the diagnosis profiled only the scheduler and named the model's own
    attention. The process whose CPU use was higher at the task's load is the one looked in."""
    root = tmp_path / "sglang"
    for cores, process, function in (
        ({"scheduler": 0.55, "tokenizer": 0.95}, "front end", "front.py:convert_logprob_style"),
        ({"scheduler": 0.95, "tokenizer": 0.55}, "scheduler", "scheduler.py:forward"),
        ({"scheduler": 0.1, "tokenizer": 0.2}, "scheduler", "scheduler.py:forward"),  # idle front
    ):
        parts = ({"forward": 100}, {"convert_logprob_style": 100}, cores)
        profiles, found, strong, evidence = _looked_in(monkeypatch, root, lambda heavy, p=parts: p)
        assert profiles.process == process
        assert strong and found.function == f"sglang/{function}"
        assert found.stage.startswith(process)
        assert (
            f"scheduler {cores['scheduler']:.2f} cores, front end (HTTP server process) {cores['tokenizer']:.2f}"
            in "\n".join(evidence)
        )
        # A front end at half the scheduler's CPU or more is shown, though not looked in.
        shown = "front end profile (busy, not looked in), hottest at the task's load:" in evidence
        assert shown is (process == "scheduler" and cores["tokenizer"] >= cores["scheduler"] / 2)


def test_a_scheduler_whose_idle_loop_grows_sends_the_look_to_the_front_end(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """sglang-real-scored-stream on a quiet machine: the front end (0.6 cores) held the fault but
    used less CPU than the scheduler (0.7-0.8), whose work that grew with the load was its idle
    loop, and the diagnosis named that loop. A scheduler idling more per token as the load rises
    is waiting for requests: the front end is looked in."""
    cores = {"scheduler": 0.8, "tokenizer": 0.6}
    for idle, process, function in (
        ((5, 200), "front end", "front.py:stream_results"),  # idle grows 40x
        ((5, 6), "scheduler", "scheduler.py:Scheduler.forward"),  # idle as at light load
    ):

        def runs(heavy: bool, idle: tuple[int, int] = idle):  # type: ignore[no-untyped-def]
            sched = {"Scheduler.forward": 100, "Scheduler.on_idle": idle[heavy]}
            return sched, {"stream_results": 90, "handle": 10}, cores

        profiles, found, _, evidence = _looked_in(monkeypatch, tmp_path / "sglang", runs)
        assert profiles.process == process
        assert found.function == f"sglang/{function}"
        said = any("its idle loop" in line for line in evidence)
        assert said is (process == "front end")


def test_the_detokenizer_is_profiled_and_looked_in_when_busiest(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """sglang-real-long-stream's fault runs in the detokenizer, a process diagnose did not
    profile: its CPU is stated, a busy one's hottest functions are shown, and one busier than
    the scheduler is looked in."""
    root = tmp_path / "sglang"
    detok = {"DetokenizerManager._decode_batch_token_id_output": 80, "event_loop": 20}
    for cores, process, function in (
        ({"scheduler": 0.6, "tokenizer": 0.2, "detokenizer": 0.9}, "detokenizer",
         "detok.py:DetokenizerManager._decode_batch_token_id_output"),
        ({"scheduler": 0.9, "tokenizer": 0.2, "detokenizer": 0.5}, "scheduler",
         "scheduler.py:forward"),
    ):  # fmt: skip
        parts = ({"forward": 100}, {"handle": 100}, cores, detok)
        profiles, found, strong, evidence = _looked_in(monkeypatch, root, lambda h, p=parts: p)
        assert profiles.process == process and found.function == f"sglang/{function}"
        assert f"detokenizer {cores['detokenizer']:.2f} cores" in "\n".join(evidence)
        shown = "detokenizer profile (busy, not looked in), hottest at the task's load:" in evidence
        assert shown is (process == "scheduler")


def test_a_helper_whose_cpu_per_token_grows_with_the_answer_is_looked_in(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """sglang-real-long-stream at 16 answers of 1024 tokens: the detokenizer (0.29 cores) held the
    fault beside a scheduler at 0.98, and diagnose named a scheduler function that grew with the
    load. The workload again with answers 4x shorter shows the detokenizer's CPU per token grow
    with the answer (a helper runs no model: its work per token should not): it is looked in, and
    the function that grows with the length is named. Flat, the scheduler is as before; short
    answers are not profiled again."""
    cores = {"scheduler": 0.98, "tokenizer": 0.13, "detokenizer": 0.29}

    def runs(heavy: bool, cut: int, grows: bool = True):  # type: ignore[no-untyped-def]
        whole = 80 // cut if grows else 80
        detok = {"DetokenizerManager.decode_whole": whole, "event_loop": 20}
        scaled = dict(cores, detokenizer=0.29 * (whole + 20) / 100)
        return {"forward": 100}, {"handle": 100}, scaled, detok

    long = {"output_len": 1024}
    profiles, found, strong, evidence = _looked_in(monkeypatch, tmp_path / "sglang", runs, long)
    assert profiles.process == "detokenizer" and profiles.axis == "answer length" and strong
    assert found.function == "sglang/detok.py:DetokenizerManager.decode_whole"
    assert "grows with the answer length" in found.stage and "answers 4x shorter" in found.detail
    assert "growing as fast with it" not in found.detail  # the one function that grows
    text = "\n".join(evidence)
    assert "detokenizer CPU per 1k tokens: 0.29 CPU-s with the task's answers, 0.116" in text
    assert "(2.50x)" in text and "front end CPU per 1k tokens" in text

    def flat(heavy: bool, cut: int):  # type: ignore[no-untyped-def]
        return runs(heavy, cut, grows=False)

    for params in (long, {"output_len": 64}):
        profiles, found, _, evidence = _looked_in(monkeypatch, tmp_path / "sglang", flat, params)
        assert profiles.process == "scheduler" and profiles.axis == "load"
        said = any("answers 4x shorter" in line for line in evidence)
        assert said is (params is long)


def test_scheduler_work_outside_the_model_that_grows_with_the_answer_is_named(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """sglang-real-stop-pattern (the engine's own fault): `Req.tail_str` decodes the whole answer
    every step, in the scheduler; nothing there grows with the load, and the hottest function is
    the model's decode attention, which grows with the context by design (and faster in samples
    than the fault). With the model's forward pass left out, what grows with the answer is named
    (not the scheduler's loop around it, which grows too); with no such growth, the hottest
    function is, as before."""
    cores = {"scheduler": 1.0, "tokenizer": 0.13, "detokenizer": 0.05}

    def runs(heavy: bool, cut: int, fault: bool = True):  # type: ignore[no-untyped-def]
        tail = 16 // cut if fault else 4
        sched = {  # the loop grows 2.5x with the answer, but only because tail_str (4x) does
            "loop;ModelRunner.forward;attention": 60 // cut + 5, "loop;Req.tail_str": tail,
            "loop;step": 4,
        }  # fmt: skip
        return sched, {"handle": 100}, cores, {"decode": 10}

    long = {"output_len": 1024}
    profiles, found, strong, evidence = _looked_in(monkeypatch, tmp_path / "sglang", runs, long)
    assert profiles.process == "scheduler" and strong
    assert found.function == "sglang/scheduler.py:Req.tail_str"
    assert "answer length, outside the model's forward pass" in found.stage
    assert "answers 4x shorter" in found.detail

    def flat(heavy: bool, cut: int):  # type: ignore[no-untyped-def]
        return runs(heavy, cut, fault=False)

    _, found, _, _ = _looked_in(monkeypatch, tmp_path / "sglang", flat, long)
    assert found.function == "sglang/scheduler.py:attention" and "hottest" in found.stage


def test_a_busy_schedulers_idle_loop_sends_no_look_away_and_is_never_named(
    monkeypatch, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """sglang-real-label-burst: the scheduler at 0.94 cores (its main thread holding the GIL
    throughout) beside a front end at 0.38; its idle loop grew 4x per token, and the idle-loop
    rule sent the look to the front end, which named the HTTP server's own loop. A helper under
    half the scheduler's CPU is not what it waits for: the scheduler is looked in, and its idle
    loop, time without work, is not the answer (here its hottest function is)."""
    cores = {"scheduler": 0.94, "tokenizer": 0.38}

    def runs(heavy: bool):  # type: ignore[no-untyped-def]
        sched = {"Allocator.free": 60, "Scheduler.on_idle": 20 if heavy else 5, "step": 20}
        return sched, {"serve": 90, "send": 10}, cores

    profiles, found, _, evidence = _looked_in(monkeypatch, tmp_path / "sglang", runs)
    assert (
        profiles.process == "scheduler" and found.function == "sglang/scheduler.py:Allocator.free"
    )
    assert not any("its idle loop" in line for line in evidence)


def test_the_profile_folder_is_the_confined_servers_to_write(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A confined server runs as a uid of its own that owns its workdir; the precision audit made
    the trace folder there as root, and the scheduler died writing its trace into it
    (PermissionError, sglang-real-rollout-logprob-mismatch: "Server disconnected")."""
    import os
    from types import SimpleNamespace

    from infra_agent.serving.instruments import precision

    if os.geteuid() != 0:
        pytest.skip("giving a folder to another uid needs root")
    workdir = tmp_path / "serving"
    workdir.mkdir()
    os.chown(workdir, 54321, 54321)
    owners: list[int] = []

    class Server:
        def __init__(self) -> None:
            self.workdir = workdir

        def call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
            if fn is precision._post:
                return 200, ""
            out = workdir / "torch-profile"
            owners.append(out.stat().st_uid)
            (out / "audit.trace.json").write_text('{"traceEvents": []}')
            return None

    monkeypatch.setattr(precision, "gate_prompts", lambda *a, **k: [])
    monkeypatch.setattr(precision.time, "sleep", lambda s: None)
    harness = SimpleNamespace(server=lambda arm: Server(), gate=None, vocab=10)
    assert precision.record_trace(harness, None) == []
    assert owners == [54321]
