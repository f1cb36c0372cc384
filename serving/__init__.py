"""The SGLang serving target, by concern.

The runtime, at the top: `env` (the cached SGLang virtual environment, `python -m
infra_agent.serving.env --ensure`), `tiny_model` (a tiny Llama model generated locally),
`deployment` (a task's deployment spec), `knobs` (the typed catalogue of server arguments),
`launch` (the command line, port and GPUs), `overlay` (source patches through a private
PYTHONPATH), `isolation` (the server's confinement, from `sandboxes/`), `server` (start, ready,
pause, stop) and `kernel_shim/` (the `sgl_kernel` CPU module, servers without a GPU only).
- `load/`: request datasets, the async load generator, a run's metrics, stress reproduction.
- `instruments/`: profiles, GIL traces, scheduler steps, captures, precision, diagnosis.
- `harness/`: `ServingHarness` and the harnesses of accuracy and corruption-under-load tasks,
  with the judgement of what an arm answered.
The output health guard lives in `infra_agent.feedback.health`.
"""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.serving":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.serving")
