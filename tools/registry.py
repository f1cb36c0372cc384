"""The tools a run gives its model. A new tool is one function plus one line here."""

from __future__ import annotations

from infra_agent.tools.base import Tool, ToolRegistry
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
    serving_workload,
    propose_patch,
    propose_knobs,
    run_experiment,
    finish,
]


def default_registry() -> ToolRegistry:
    return ToolRegistry(list(AGENT_TOOLS))
