"""Isolation for candidate code: a small Sandbox interface with local and docker backends, and
the pieces any confined process is held with: its process tree (`proctree`), a watch on it from
outside (`procwatch`), its processes frozen, counted and killed together (`confined`), its own
network namespace (`netns`) and file view (`fileview`)."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.sandboxes":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.sandboxes")

from infra_agent.sandboxes.base import (  # noqa: E402
    ExecResult,
    Sandbox,
    SandboxProcess,
    SandboxSpec,
)
from infra_agent.sandboxes.registry import (  # noqa: E402
    available_backends,
    create_sandbox,
    ensure_backend,
)

__all__ = [
    "ExecResult",
    "Sandbox",
    "SandboxProcess",
    "SandboxSpec",
    "available_backends",
    "create_sandbox",
    "ensure_backend",
]
