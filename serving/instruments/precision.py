"""Where the sampling path loses precision, measured on the live server with torch.profiler.

`audit_sampling_precision(harness, arm)` asks the arm's SGLang to profile a few steps of its own
(`/start_profile` with CPU activity, operator input shapes and Python stacks; the trace is
written to the server's workdir), runs seeded sampled requests with log-probabilities through
it, and reads the trace: every operator on a tensor as wide as the vocabulary (the logits and
everything computed from them: probabilities, log-probabilities) that either converts float32
to a 16-bit type or does softmax/log/exp/division/top-k in a 16-bit type is a finding, charged
to the innermost SGLang function on that thread's Python stack when it ran. The first finding
of the first profiled step is the localization. The matrix multiplications of the model (the
LM head included) run in the model's 16-bit type by design and are not findings.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from infra_agent.errors import describe
from infra_agent.serving.harness.accuracy import answer, gate_prompts
from infra_agent.tasks.diagnose import DIAGNOSE_SEED, Localization

REDUCED_TYPES = {"c10::BFloat16", "c10::Half"}
REDUCED_CODES = {"15", "5"}
"""torch ScalarType codes of bfloat16 and float16 (as the profiler writes dtype arguments)."""
CONVERSIONS = {"aten::to", "aten::_to_copy"}
MATH = {
    "aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax", "aten::log",
    "aten::log_", "aten::exp", "aten::exp_", "aten::div", "aten::div_", "aten::topk",
}  # fmt: skip


@dataclass
class PrecisionAudit:
    localization: Localization
    evidence: list[str] = field(default_factory=list)
    measured: dict[str, float] = field(default_factory=dict)
    instruments: list[str] = field(default_factory=lambda: ["torch.profiler precision audit"])


@dataclass
class Finding:
    op: str
    ts: float
    tid: int
    input_type: str
    dims: list[int]
    function: str = "?"


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    resp = httpx.post(url + path, json=body, timeout=120.0)
    return resp.status_code, resp.text[:500]


def record_trace(harness: Any, arm: Any, steps: int = 6) -> list[dict[str, Any]]:
    """Profile `steps` scheduler steps of the arm's server while seeded sampled requests run;
    return the trace's events."""
    server = harness.server(arm)
    out = Path(server.workdir) / "torch-profile"
    out.mkdir(parents=True, exist_ok=True)
    owner = Path(server.workdir).stat()  # a confined server runs as the workdir's uid, not ours
    if out.stat().st_uid != owner.st_uid:
        os.chown(out, owner.st_uid, owner.st_gid)
    status, text = server.call(
        _post,
        "/start_profile",
        {
            "output_dir": str(out), "num_steps": steps, "activities": ["CPU"],
            "with_stack": True, "record_shapes": True, "profile_id": "audit",
        },
    )  # fmt: skip
    if status != 200:
        raise RuntimeError(f"the server refused to profile: {status} {text}")
    prompts = gate_prompts(harness.gate, vocab_size=harness.vocab, seed=DIAGNOSE_SEED)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        server.call(answer, prompts, harness.gate, sampling_seed=DIAGNOSE_SEED)
        traces = sorted(out.glob("*.trace.json*"))
        if traces:
            break
    else:
        raise RuntimeError("the server wrote no profile within 120 s")
    time.sleep(1.0)  # the exporter may still be writing
    path = traces[0]
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    events: list[dict[str, Any]] = json.loads(raw).get("traceEvents", [])
    return events


def _server_said(harness: Any, arm: Any, lines: int = 6) -> list[str]:
    """The server log's last error lines (what a dropped profiled request left there), if any."""
    try:
        tail = harness.server(arm).log_tail(200).splitlines()
    except (AttributeError, KeyError, OSError):
        return []
    marks = ("Error", "Traceback", "error:", "Killed", "Exception")
    said = [line.strip()[:200] for line in tail if any(m in line for m in marks)]
    return [f"  server log: {line}" for line in said[-lines:]]


def findings(events: list[dict[str, Any]], vocab: int) -> list[Finding]:
    """Reduced-precision operators on vocabulary-wide tensors, in time order (see the module
    docstring), each charged to its innermost SGLang Python frame."""
    found = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "cpu_op":
            continue
        args = e.get("args", {})
        types, dims = args.get("Input type") or [], args.get("Input Dims") or []
        if not types or not dims or not dims[0] or dims[0][-1] != vocab:
            continue
        name = str(e.get("name"))
        concrete = args.get("Concrete Inputs") or []
        converts = (
            name in CONVERSIONS
            and types[0] in ("float", "double")
            and len(concrete) > 1
            and concrete[1] in REDUCED_CODES
        )
        if converts or (name in MATH and types[0] in REDUCED_TYPES):
            found.append(Finding(name, float(e["ts"]), int(e.get("tid", 0)), types[0], dims[0]))
    stacks = [
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), int(e.get("tid", 0)), e["name"])
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "python_function"
        and str(e.get("name", "")).startswith("sglang/")
    ]  # fmt: skip
    for f in found:
        inner = [s for s in stacks if s[2] == f.tid and s[0] <= f.ts <= s[1]]
        if inner:
            f.function = max(inner, key=lambda s: s[0])[3]
    found.sort(key=lambda f: f.ts)
    return found


def qualified(frame: str, roots: list[Path]) -> str:
    """'sglang/srt/layers/sampler.py(297): forward' -> 'sglang/srt/layers/sampler.py:Sampler.forward'
    (the class read from the source at that line)."""
    head, _, func = frame.partition(": ")
    path, _, line = head.partition("(")
    number = int(line.rstrip(")") or 0)
    for root in roots:
        source = root.parent / path
        if source.is_file():
            tree = ast.parse(source.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if (
                            isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                            and item.name == func
                            and item.lineno <= number <= (item.end_lineno or item.lineno)
                        ):
                            return f"{path}:{node.name}.{func}"
            break
    return f"{path}:{func}"


def audit_sampling_precision(harness: Any, arm: Any) -> PrecisionAudit:
    from infra_agent.serving.instruments.diagnosis import package_dirs

    try:
        events = record_trace(harness, arm)
    except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:
        # httpx.HTTPError: the server dropped the profiled request (seen on a bfloat16-logits
        # fault, sglang-real-rollout-logprob-mismatch); the rest of the diagnosis still stands
        return PrecisionAudit(
            localization=Localization(detail=f"no precision audit: {describe(exc, typed=True)}"),
            evidence=[
                f"precision audit failed: {describe(exc, typed=True)}",
                *_server_said(harness, arm),
            ],
        )
    found = findings(events, harness.vocab)
    ops = sum(1 for e in events if e.get("cat") == "cpu_op")
    measured = {"profiled_ops": float(ops), "reduced_precision_ops": float(len(found))}
    if not found:
        return PrecisionAudit(
            localization=Localization(
                stage="sampling path", detail="no 16-bit math on vocabulary-wide tensors"
            ),
            evidence=[
                f"{ops} profiled operators; none converts or computes logits, "
                "probabilities or log-probabilities in a 16-bit type"
            ],  # fmt: skip
            measured=measured,
        )
    roots = package_dirs(harness, arm)
    first = found[0]
    where = qualified(first.function, roots) if first.function != "?" else None
    by_function: dict[str, int] = {}
    for f in found:
        by_function[f.function] = by_function.get(f.function, 0) + 1
    evidence = [
        f"{ops} profiled operators; {len(found)} run in 16 bits on vocabulary-wide tensors",
        *(f"  {n} x in {fn}" for fn, n in sorted(by_function.items(), key=lambda kv: -kv[1])[:5]),
        f"first: {first.op} on {first.input_type} {first.dims} in {first.function}",
    ]
    what = "converts to 16 bits" if first.op in CONVERSIONS else f"runs {first.op} in 16 bits"
    return PrecisionAudit(
        localization=Localization(
            stage="sampling path: logits to log-probabilities",
            function=where,
            detail=f"the first operator on the logits' path that loses precision: it {what} "
            f"a {first.dims} tensor",
        ),
        evidence=evidence,
        measured=measured,
    )
