"""The deployment in view: how a serving task's server starts, told by the objects that start it.

`deployment_view(task, params)` reads the task harness's own `DeploymentSpec`, builds the launch
command with `serving.launch.launch_command` (the function every arm's server starts through,
with the baseline's knobs) and the model's config (`serving.tiny_model.config` for the generated
tiny model, the checkpoint's config.json otherwise). The per-server parts of the command (the
model folder written for each server, its port, the arm's overlay) are shown as placeholders.
describe_task and the first message show its `render()`; a kernel task has none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.tasks.manifest import Task

DEPLOYMENT_VERSION = 1
MODEL_FOLDER = "<the tiny model's folder, written for each server>"
PORT = "<free port>"
OVERLAY = "<overlay: the task's modules and your patch>"


class DeploymentView(BaseModel):
    """A serving task's deployment as its servers start (the baseline's knobs)."""

    version: int = DEPLOYMENT_VERSION
    sglang_version: str
    argv: list[str]
    """The launch command as `launch_command` builds it, placeholders for per-server parts."""
    env: dict[str, str] = Field(default_factory=dict)
    """The environment infra-agent gives the server (host variables passed through left out)."""
    device: str
    dtype: str
    """As launched, with what SGLang resolves 'auto' to when the model config says."""
    attention_backend: str
    """As launched, or SGLang's own choice for this device when the launch leaves it unset."""
    model: str
    hf_config: dict[str, Any] = Field(default_factory=dict)
    """The model's config.json ({} when it is not readable before the server starts)."""
    gpus: int = 0
    network: str = "isolated"
    filesystem: str = "confined"

    def render(self) -> str:
        env = [f"{k}={v}" for k, v in sorted(self.env.items())]
        lines = [
            f"deployment (every arm's server starts so, with the arm's knobs and overlay; SGLang "
            f"{self.sglang_version}):",
            f"  launch: {' '.join([*env, *self.argv])}",
            f"  device {self.device}; dtype {self.dtype}; attention backend {self.attention_backend}",
            f"  model {self.model}: {_config_text(self.hf_config)}",
            f"  server: {self.network} network, {self.filesystem} file system",
        ]
        return "\n".join(lines)


def _config_text(config: dict[str, Any]) -> str:
    if not config:
        return "config read from the checkpoint when the server starts"
    text = ", ".join(
        f"{k} {'/'.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in config.items()
        if not k.endswith("_token_id")
    )
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if "head_dim" not in config and isinstance(hidden, int) and isinstance(heads, int) and heads:
        text += f" (head size {hidden // heads}: hidden_size / num_attention_heads)"
    return text


def deployment_view(task: Task, params: dict[str, Any]) -> DeploymentView | None:
    """The deployment of a serving task's harness (None for a task without one). Raises
    UserError when the harness or its deployment spec cannot be loaded."""
    from infra_agent.serving.harness import ServingHarness
    from infra_agent.tasks.patch import effective_knobs
    from infra_agent.tools.workload import harness_of

    harness = harness_of(task, params)
    if not isinstance(harness, ServingHarness):
        return None
    spec = harness.deployment
    knobs = effective_knobs(None, task.manifest)  # the baseline arm's knobs
    args = {**spec.server_args, **knobs}
    argv, env = _launch(spec, knobs)
    config = _model_config(spec.model)
    device = str(args.get("device", "cuda" if spec.gpus else "auto"))
    return DeploymentView(
        sglang_version=spec.sglang_version, argv=argv, env=env, device=device,
        dtype=_dtype(args, config), attention_backend=_attention_backend(args, device),
        model="tiny (generated locally, seeded weights)" if spec.model == "tiny" else spec.model,
        hf_config=config, gpus=spec.gpus, network=spec.network, filesystem=spec.filesystem,
    )  # fmt: skip


def _launch(spec: Any, knobs: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """`launch_command` on the spec, without installing SGLang or writing a model folder."""
    from infra_agent.errors import UserError
    from infra_agent.serving.env import env_python, sglang_env_path
    from infra_agent.serving.launch import PASSED_ENV, launch_command

    shown = spec.model_copy(update={"model": MODEL_FOLDER}) if spec.model == "tiny" else spec
    if spec.launch == "venv":  # launch_command would install the venv first; its path suffices
        python = env_python(sglang_env_path(spec.sglang_version))
        shown = shown.model_copy(update={"launch": "command", "command": [str(python), "-m", "sglang.launch_server"]})  # fmt: skip
    try:
        argv, env = launch_command(shown, port=0, knobs=knobs, model_cache=Path(), overlay=Path(OVERLAY))  # fmt: skip
    except UserError as exc:
        return [f"(cannot be built: {exc})"], {}
    argv = [PORT if a == "0" and argv[i - 1] == "--port" else a for i, a in enumerate(argv)]
    return argv, {k: v for k, v in env.items() if k not in PASSED_ENV}


def _model_config(model: str) -> dict[str, Any]:
    from infra_agent.serving.tiny_model import VOCAB_SIZE, config

    if model == "tiny":
        return config(VOCAB_SIZE)
    path = Path(model) / "config.json"
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _dtype(args: dict[str, Any], config: dict[str, Any]) -> str:
    dtype = str(args.get("dtype", "auto"))
    declared = config.get("torch_dtype")
    if dtype == "auto" and declared in ("bfloat16", "float16"):
        return f"auto -> {declared} (the model config's torch_dtype)"
    return dtype


def _attention_backend(args: dict[str, Any], device: str) -> str:
    if "attention-backend" in args:
        return str(args["attention-backend"])
    if device != "cpu":
        return "not set: SGLang picks one for the GPU and model when it starts"
    # SGLang 0.5.23 (arg_groups/platform_hook.handle_cpu_backends and the intel_amx fallback in
    # arg_groups/overrides.py): intel_amx for device cpu, torch_native on CPUs without AMX.
    amx = "amx_tile" in _cpu_flags()
    chosen = "intel_amx" if amx else "torch_native"
    return f"{chosen} (not set: SGLang's choice for device cpu on a CPU {'with' if amx else 'without'} AMX)"  # fmt: skip


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for line in text.splitlines() if line.startswith("flags") for f in line.split()}
