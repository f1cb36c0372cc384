"""Sandbox backends by name: one module plus one registration line each.

A backend is a `Sandbox` subclass and a probe that says why it cannot be used here (None when
it can). Backends are imported lazily, so the `docker` SDK is only needed for `docker`.
"""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra_agent.errors import UserError
from infra_agent.sandboxes.base import Sandbox, SandboxSpec


@dataclass(frozen=True)
class Backend:
    cls_path: str
    """'module:Class' of the Sandbox subclass."""
    probe: Callable[[], str | None]
    """None when usable here, else the reason it is not."""


def _local_probe() -> str | None:
    if shutil.which("bwrap") or (os.geteuid() == 0 and shutil.which("unshare")):
        return None
    return "neither bubblewrap nor (as root) unshare is available: no network isolation"


def _docker_probe() -> str | None:
    from infra_agent.sandboxes.container import engine_problem

    return engine_problem()


BACKENDS: dict[str, Backend] = {
    "local": Backend("infra_agent.sandboxes.local:LocalSandbox", _local_probe),
    "docker": Backend("infra_agent.sandboxes.container:DockerSandbox", _docker_probe),
}


def available_backends() -> dict[str, str | None]:
    """backend -> None if usable on this machine, else the reason (one line)."""
    return {name: backend.probe() for name, backend in BACKENDS.items()}


def ensure_backend(name: str) -> None:
    """Make backend `name` usable here or raise UserError saying why it cannot be. For docker
    with no engine answering on DOCKER_HOST (or without the sandbox image) this starts the
    process's own private dockerd and builds the image (docker_engine.private_engine), as a
    user of `--sandbox docker` expects; it needs dockerd installed and root."""
    if name not in BACKENDS:
        raise UserError(f"unknown sandbox backend '{name}' (known: {', '.join(sorted(BACKENDS))})")
    problem = BACKENDS[name].probe()
    if problem is not None and name == "docker" and shutil.which("dockerd") is not None:
        if os.geteuid() != 0:
            problem += "; a private engine needs root"
        else:
            from infra_agent.sandboxes.docker_engine import private_engine

            private_engine()
            problem = BACKENDS[name].probe()
    if problem is not None:
        raise UserError(f"sandbox backend '{name}' cannot be used here: {problem}")


def create_sandbox(backend: str, workspace: Path, spec: SandboxSpec | None = None) -> Sandbox:
    """A new sandbox holding a private copy of `workspace`; use it as a context manager."""
    if backend not in BACKENDS:
        known = ", ".join(sorted(BACKENDS))
        raise UserError(f"unknown sandbox backend '{backend}' (known: {known})")
    if not Path(workspace).is_dir():
        raise UserError(f"sandbox workspace '{workspace}' is not a folder")
    module_name, cls_name = BACKENDS[backend].cls_path.split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    sandbox: Sandbox = cls(Path(workspace), spec or SandboxSpec())
    return sandbox
