"""Runs exported as verified, reviewer-labelled training data (ATIF, OpenAI SFT, RL rows)."""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.trajectories":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.trajectories")
