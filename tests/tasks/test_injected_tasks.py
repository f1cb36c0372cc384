"""The injected-fault tasks, statically: each fault applies to the installed SGLang, its reference
patch takes it out, its wrong fix does not, and nothing the agent can read names it."""

from __future__ import annotations

import shutil

import pytest
from support import assert_agent_reads_no_site, needs_sglang_env

from infra_agent.serving.env import SGLANG_VERSION
from infra_agent.tasks.patch import load_patch, parse_files
from infra_agent.tasks.registry import list_tasks
from infra_agent.tasks.sites import fault_sites
from infra_agent.tasks.tree import preview_apply, uninjected_patch, workspace_tree

pytestmark = needs_sglang_env()
INJECTED = [t for t in list_tasks(search_path=[]) if t.inject_patch is not None]


def test_five_failure_classes_are_covered() -> None:
    classes = {t.manifest.fault.failure_class for t in INJECTED if t.manifest.fault}
    assert len(INJECTED) >= 5 and len(classes) == len(INJECTED)


@pytest.mark.parametrize("task", INJECTED, ids=lambda t: t.name)
def test_fault_reference_and_wrong_fix(task) -> None:  # type: ignore[no-untyped-def]
    spec = task.manifest.workspace
    assert (spec.package, spec.version) == ("sglang", SGLANG_VERSION)
    assert task.manifest.fault is not None and task.manifest.fault.failure_class
    tree = workspace_tree(task)
    root = tree.root
    assert tree.injected and all(
        tree.read_bytes(rel) != (root / rel).read_bytes() for rel in tree.injected
    )

    def patched(path):  # type: ignore[no-untyped-def]
        scratch = preview_apply(load_patch(path), task)
        try:
            return {rel: (scratch / "ws" / rel).read_bytes() for rel in tree.injected}
        finally:
            shutil.rmtree(scratch)

    installed = {rel: (root / rel).read_bytes() for rel in tree.injected}
    assert patched(task.reference_patch) == installed
    assert task.wrong_fix_patch is not None and patched(task.wrong_fix_patch) != installed
    clean = uninjected_patch(task)
    assert clean is not None and sorted(clean.files) == sorted(tree.injected)


@pytest.mark.parametrize("task", INJECTED, ids=lambda t: t.name)
def test_nothing_the_agent_reads_names_the_fault(task) -> None:  # type: ignore[no-untyped-def]
    diff = task.inject_patch.read_text()
    lines = diff.splitlines()
    added = [line[1:] for line in lines if line.startswith("+") and not line.startswith("+++")]
    removed = [line for line in lines if line.startswith("-") and not line.startswith("---")]
    # A fault may be code that is missing (a removed line), as regressions often are.
    assert added or removed, "an empty fault"
    assert not any("#" in line for line in added), "a comment in the injected code"
    files = {p for change in parse_files(diff) for p in change.paths()}
    sites = fault_sites(task)
    assert {rel for rel, _ in sites} == files
    assert_agent_reads_no_site(task, sites)
