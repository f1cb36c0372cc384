"""The reviewer approval queue: risk policy, queue, web UI and CLI."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.review":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.review")
