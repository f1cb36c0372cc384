"""The tools a run gives its model. A new tool is one function plus one line here."""

from __future__ import annotations

from infra_agent.tools.base import Tool, ToolRegistry
from infra_agent.tools.gil import gil_trace
from infra_agent.tools.instruments import INSTRUMENT_TOOLS
from infra_agent.tools.patching import (
    describe_task,
    finish,
    propose_knobs,
    propose_patch,
    run_experiment,
)
from infra_agent.tools.serving import serving_workload
from infra_agent.tools.skeletons import lookup_skeletons
from infra_agent.tools.workspace import list_files, read_file, search_files

AGENT_TOOLS: list[Tool] = [  # type: ignore[type-arg]
    describe_task,
    list_files,
    read_file,
    search_files,
    lookup_skeletons,
    *INSTRUMENT_TOOLS,
    gil_trace,
    serving_workload,
    propose_patch,
    propose_knobs,
    run_experiment,
    finish,
]


SPARSE_TOOLS = (
    "describe_task",
    "list_files",
    "read_file",
    "search_files",
    "propose_patch",
    "propose_knobs",
    "run_experiment",
    "finish",
)
"""Sparse feedback: reading, editing, run_experiment and finish; no instruments, no skeletons."""


def default_registry(feedback: str = "dense") -> ToolRegistry:
    """Every tool (`dense`), or only the sparse-feedback ones (`sparse`)."""
    if feedback == "sparse":
        return ToolRegistry([t for t in AGENT_TOOLS if t.name in SPARSE_TOOLS])
    return ToolRegistry(list(AGENT_TOOLS))
