"""The SGLang serving target: environment, server lifecycle, workloads, knobs and accuracy gate."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.serving":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.serving")
