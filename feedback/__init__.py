"""Dense-feedback instruments: accuracy diffs, profiler timelines, microbenchmarks, GIL tracing, output health."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.feedback":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.feedback")
