"""How a deployment's server is started: its command line and environment, a free port, the
GPUs it may use. Every arm's server starts through `launch_command` (`Server.start`), and the
deployment tool shows the same command.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.serving.deployment import ArgValue, DeploymentSpec, args_to_argv
from infra_agent.serving.env import ensure_sglang_env, env_python
from infra_agent.serving.tiny_model import write_tiny_model

SHIM_DIR = Path(__file__).parent / "kernel_shim"
"""Holds the `sgl_kernel` CPU compatibility module (first on PYTHONPATH when no GPU is present)."""
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER")
"""Host variables a server inherits; everything else (API keys, tokens) is left behind."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpu_count() -> int:
    """NVIDIA GPUs visible on this machine (device nodes /dev/nvidiaN)."""
    return sum(1 for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())


def has_gpu() -> bool:
    """True when an NVIDIA GPU is present (the CPU shim is used only without one)."""
    return gpu_count() > 0


def model_path(spec: DeploymentSpec, cache: Path) -> str:
    """The model argument: the generated tiny model's folder, or the spec's model as given."""
    if spec.model == "tiny":
        return str(
            write_tiny_model(cache / f"tiny-llama-seed{spec.model_seed}", seed=spec.model_seed)
        )
    return spec.model


def launch_command(
    spec: DeploymentSpec,
    *,
    port: int,
    knobs: dict[str, ArgValue] | None = None,
    model_cache: Path,
    overlay: Path | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) that start this deployment's server on 127.0.0.1:port."""
    if spec.launch == "docker":
        raise UserError("deployment launch = 'docker' is not built yet; use 'venv' or 'command'")
    if spec.launch == "venv":
        prefix = [
            str(env_python(ensure_sglang_env(spec.sglang_version))),
            "-m",
            "sglang.launch_server",
        ]
    elif spec.command:
        prefix = list(spec.command)
    else:
        raise UserError("deployment launch = 'command' needs a non-empty 'command'")
    args: dict[str, ArgValue] = {"model-path": model_path(spec, model_cache)}
    args.update(spec.server_args)
    args.update(knobs or {})
    args.update({"host": "127.0.0.1", "port": port})
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    path = []
    if overlay is not None:
        path.append(str(overlay))
    if not spec.needs_gpu and not has_gpu():
        env["SGLANG_USE_CPU_ENGINE"] = "1"  # without it, --device cpu takes the GPU code path
        path.append(str(SHIM_DIR))
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(spec.env)
    return prefix + args_to_argv(args), env
