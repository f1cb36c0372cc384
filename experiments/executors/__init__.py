"""Executors run experiments: `local` (the embedded default) or `ray` (a cluster, or a local Ray).

Add a backend: one module implementing `Executor`, one line in `EXECUTORS`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from infra_agent.errors import UserError
from infra_agent.experiments.executors.base import (
    ExecutionOutcome,
    Executor,
    ExperimentRequest,
    Resources,
    execute_request,
    failed_outcome,
    run_batch,
)


def _local(**options: Any) -> Executor:
    from infra_agent.experiments.executors.local import LocalExecutor

    return LocalExecutor(**options)


def _ray(**options: Any) -> Executor:
    if importlib.util.find_spec("ray") is None:
        raise UserError("executor 'ray' needs Ray: pip install 'infra-agent[ray]'")
    from infra_agent.experiments.executors.ray import RayExecutor

    return RayExecutor(**options)


EXECUTORS: dict[str, Callable[..., Executor]] = {"local": _local, "ray": _ray}


def create_executor(name: str, **options: Any) -> Executor:
    """The executor called `name` ('local' or 'ray'), configured with `options`."""
    if name not in EXECUTORS:
        raise UserError(f"unknown executor '{name}' (known: {', '.join(sorted(EXECUTORS))})")
    return EXECUTORS[name](**options)


__all__ = [
    "EXECUTORS",
    "ExecutionOutcome",
    "Executor",
    "ExperimentRequest",
    "Resources",
    "create_executor",
    "execute_request",
    "failed_outcome",
    "run_batch",
]
