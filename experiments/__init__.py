"""Experiments: the verification cascade that turns a patch into a Verdict with Evidence, and executors.

from infra_agent.experiments import run_experiment, task_fingerprint
"""

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.experiments":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.experiments")

from typing import Any  # noqa: E402


def __getattr__(name: str) -> Any:
    # Lazy: `experiments.verdict` is imported by the store's records, and the cascade imports the
    # store, so the cascade cannot be imported when this package is.
    if name in ("run_experiment", "task_fingerprint"):
        from infra_agent.experiments import cascade

        return getattr(cascade, name)
    raise AttributeError(f"module 'infra_agent.experiments' has no attribute '{name}'")


__all__ = ["run_experiment", "task_fingerprint"]
