"""Experiments: the verification cascade that turns a patch into a Verdict with Evidence, and executors."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.experiments":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.experiments")
