"""What the agent may call: typed tools with JSON schemas, thin adapters over the instruments."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.tools":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.tools")
