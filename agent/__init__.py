"""The agent loop: a LangGraph graph and the policies (llm, search, scripted) that drive it."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.agent":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.agent")
