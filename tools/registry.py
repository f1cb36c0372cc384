"""The tools a run gives its model. A new tool is one function plus one line here; a tool that
only works for some tasks says so with `needs=` on its `@tool` (see `tools.base.NEEDS`), and a
run on a task is offered only the tools that can work for it. Instruments (`@instrument`, one
module each) are listed here too: `infra-agent feedback run NAME --task T` runs them from this
list, exactly as the model calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra_agent.tools.accuracy_diff import accuracy_diff
from infra_agent.tools.base import Tool, ToolRegistry
from infra_agent.tools.capture import capture
from infra_agent.tools.editing import edit_file
from infra_agent.tools.gil import gil_trace
from infra_agent.tools.microbench import microbench
from infra_agent.tools.patching import (
    describe_task,
    finish,
    propose_knobs,
    propose_patch,
    run_experiment,
)
from infra_agent.tools.profile import profile
from infra_agent.tools.server_trace import server_profile
from infra_agent.tools.serving import server_steps, serving_workload
from infra_agent.tools.skeletons import lookup_skeletons
from infra_agent.tools.workspace import list_files, read_file, search_files

if TYPE_CHECKING:
    from infra_agent.tasks.manifest import Task

AGENT_TOOLS: list[Tool] = [  # type: ignore[type-arg]
    describe_task,
    list_files,
    read_file,
    search_files,
    lookup_skeletons,
    microbench,
    accuracy_diff,
    profile,
    gil_trace,
    serving_workload,
    server_steps,
    server_profile,
    capture,
    propose_patch,
    edit_file,
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
    "edit_file",
    "propose_knobs",
    "run_experiment",
    "finish",
)
"""Sparse feedback: reading, editing, run_experiment and finish; no instruments, no skeletons."""


def default_registry(feedback: str = "dense", task: Task | None = None) -> ToolRegistry:
    """Every tool (`dense`), or only the sparse-feedback ones (`sparse`); with a task, only those
    that can work for it (no serving tools on a kernel task, no propose_knobs without knobs)."""
    tools = [t for t in AGENT_TOOLS if feedback != "sparse" or t.name in SPARSE_TOOLS]
    return ToolRegistry([t for t in tools if task is None or t.works_for(task)])
