"""Experiments: the verification cascade that turns a patch into a Verdict with Evidence, and executors.

from infra_agent.experiments import run_experiment, task_fingerprint
"""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.experiments":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.experiments")

from infra_agent.experiments.run import run_experiment, task_fingerprint  # noqa: E402

__all__ = ["run_experiment", "task_fingerprint"]
