"""The SGLang serving target: environment, server lifecycle, workloads, knobs and accuracy gate.

- `env`: the cached SGLang virtual environment (`python -m infra_agent.serving.env --ensure`).
- `tiny_model`: a tiny Llama-architecture model generated locally (no downloads).
- `deployment`: the deployment spec (TOML) of a serving task.
- `server`: start on a free port, wait for readiness, capture logs, stop the whole process tree.
- `kernel_shim/`: the `sgl_kernel` CPU compatibility module (servers without a GPU only).
- `datasets`, `workload`, `metrics`: request sets, the async load generator, throughput/TTFT/TPOT.
- `knobs`: the typed catalogue of server arguments, checked against `launch_server --help`.
- `accuracy`: the accuracy gate (greedy tokens + top-k log-probability distance).
- `overlay`: source patches to SGLang through a private PYTHONPATH overlay.
- `stress`: the same request N times under background load, anomalies per 10,000.
- `harness`: `ServingHarness`, the harness serving tasks subclass.
The output health guard lives in `infra_agent.feedback.health`.
"""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.serving":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.serving")
