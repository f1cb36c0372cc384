"""The deployment spec: how a serving target is started, checked for readiness and stopped.

Part of a serving task (`deployment.toml` next to `task.toml`), for example:

    [deployment]
    model = "tiny"                       # the generated tiny model, or a model folder / hub name
    launch = "venv"                      # the project's cached SGLang venv ("command": own argv)
    gpus = 0
    ready_timeout_s = 240
    network = "isolated"                 # own network namespace, loopback only ("host": unconfined)
    filesystem = "confined"              # system folders + what it needs ("host": everything)
    [deployment.server_args]             # passed as --name value (true: --name; false: omitted)
    device = "cpu"
    max-total-tokens = 32768

The arm's knobs are merged over `server_args` when an arm's server starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra_agent.errors import UserError
from infra_agent.serving.env import SGLANG_VERSION

ArgValue = str | int | float | bool


class DeploymentSpec(BaseModel):
    """One SGLang deployment. Docstrings give units."""

    model_config = ConfigDict(extra="forbid")

    engine: Literal["sglang"] = "sglang"
    sglang_version: str = SGLANG_VERSION
    model: str = "tiny"
    """'tiny' (generated locally, see serving/tiny_model.py), a model folder, or a hub name."""
    model_seed: int = 0
    """Seed of the generated tiny model's weights and tokenizer."""
    launch: Literal["venv", "command", "docker"] = "venv"
    """'venv': `python -m sglang.launch_server` from the cached SGLang venv; 'command': the argv
    in `command` (e.g. a cluster's own python); 'docker': `image` (not built yet)."""
    command: list[str] = Field(default_factory=list)
    """argv that starts the server, before the server arguments (launch = 'command')."""
    image: str | None = None
    """Container image (launch = 'docker')."""
    gpus: int = 0
    """GPUs the deployment needs; 0 runs on the CPU (SGLANG_USE_CPU_ENGINE=1, kernel shim)."""
    server_args: dict[str, ArgValue] = Field(default_factory=dict)
    """Server arguments without leading dashes."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment of the server process."""
    health_path: str = "/health"
    """Readiness check: GET this path until it answers 200."""
    ready_timeout_s: float = 300.0
    """Seconds to wait for readiness before the start counts as failed."""
    stop_timeout_s: float = 20.0
    """Seconds between SIGTERM and SIGKILL when stopping."""
    network: Literal["isolated", "host"] = "isolated"
    """'isolated': the server gets its own network namespace with only a loopback (no route out,
    the host's 127.0.0.1 services unreachable; needs root, else it falls back to the host network
    and says why); 'host': the host network (e.g. multi-node NCCL)."""
    filesystem: Literal["confined", "host"] = "confined"
    """'confined': the server sees the system folders, the paths it needs (read-only) and its
    workdir (read-write) through bubblewrap, not homes, /run, /var or the rest of /tmp; 'host':
    the whole file system (serving/fileview.py)."""
    readable_paths: list[Path] = Field(default_factory=list)
    """More host paths a confined server may read (a model cache, a launch script's folder)."""

    @property
    def needs_gpu(self) -> bool:
        return self.gpus > 0


def load_deployment(path: Path) -> DeploymentSpec:
    """Parse `[deployment]` of a TOML file; UserError naming the file and field on problems."""
    if not path.is_file():
        raise UserError(f"{path}: deployment spec not found")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML ({exc})") from exc
    if "deployment" not in data:
        raise UserError(f"{path}: no [deployment] table")
    try:
        return DeploymentSpec.model_validate(data["deployment"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise UserError(f"{path}: field 'deployment.{where}': {first['msg']}") from exc


def args_to_argv(args: dict[str, ArgValue]) -> list[str]:
    """{'chunked-prefill-size': 64, 'disable-radix-cache': True} -> ['--chunked-prefill-size',
    '64', '--disable-radix-cache']; False omits a flag. Underscores become dashes."""
    argv: list[str] = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            continue
        else:
            argv += [flag, str(value)]
    return argv
