"""Tasks whose fault is the engine's own code (no inject.patch; `[fault] sites` name where it
lives): the sites exist in the installed SGLang, the reference fix changes one of them and the
wrong fix none, and nothing the agent can read names them."""

from __future__ import annotations

import ast

import pytest
from pydantic import ValidationError
from support import assert_agent_reads_no_site, needs_sglang_env

from infra_agent.serving.env import SGLANG_VERSION
from infra_agent.serving.overlay import installed_package
from infra_agent.tasks.manifest import Fault
from infra_agent.tasks.patch import load_patch
from infra_agent.tasks.registry import list_tasks
from infra_agent.tasks.sites import at_fault, fault_sites

FAULTED = [
    t
    for t in list_tasks(search_path=[])
    if t.inject_patch is None and t.manifest.fault is not None and t.manifest.fault.sites
]


def test_a_site_must_name_a_module_and_a_function() -> None:
    for bad in ("sglang/srt/x.py", "sglang/srt/x.py::", "x::tail_str", "x.py::Req.tail_str"):
        with pytest.raises(ValidationError, match="is not 'module path.py::function'"):
            Fault(sites=[bad])


@needs_sglang_env()
@pytest.mark.parametrize("task", FAULTED, ids=lambda t: t.name)
def test_declared_sites_reference_and_wrong_fix(task) -> None:  # type: ignore[no-untyped-def]
    sites = fault_sites(task)
    assert len(sites) == len(task.manifest.fault.sites)
    package = installed_package(SGLANG_VERSION).parent
    for rel, function in sites:
        tree = ast.parse((package / rel).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert function in names, f"{rel} has no function {function}"
    assert at_fault(task, load_patch(task.reference_patch)) is True
    assert at_fault(task, load_patch(task.wrong_fix_patch)) is False
    assert_agent_reads_no_site(task, sites)


def test_the_suite_has_a_fault_of_the_engines_own() -> None:
    assert FAULTED, "no bundled task declares a fault in the installed engine"
