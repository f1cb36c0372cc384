"""What is optimized: task folders (manifest, workspace, harness), patches, and the task registry."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.tasks":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.tasks")
