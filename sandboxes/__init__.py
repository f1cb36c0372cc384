"""Isolation for candidate code: a small Sandbox interface with local and docker backends."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.sandboxes":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.sandboxes")
