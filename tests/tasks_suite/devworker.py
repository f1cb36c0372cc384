"""A development stand-in for the experiment engine's RPC worker: runs workspace code in-process.

Used only by `test_workspaces.py` to exercise workspace code and harness logic quickly; the
verdict tests go through the real engine (`run_experiment`).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from infra_agent.tasks.harness import Arm, Harness
from infra_agent.tasks.manifest import Task, load_task

BUNDLED = Path(__file__).resolve().parents[2] / "bundled_tasks"


class InProcessWorker:
    """Imports the workspace's modules under their plain names, swapped in for each call."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.names = {p.stem for p in root.glob("*.py")}
        self.modules: dict[str, Any] = {}

    def call(self, target: str, *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        module_name, func = target.split(":")
        saved = {n: sys.modules.pop(n) for n in self.names if n in sys.modules}
        sys.modules.update(self.modules)
        sys.path.insert(0, str(self.root))
        try:
            module = importlib.import_module(module_name)
            return getattr(module, func)(*args, **kwargs)
        finally:
            sys.path.remove(str(self.root))
            self.modules = {n: sys.modules.pop(n) for n in self.names if n in sys.modules}
            sys.modules.update(saved)

    def timed_call(
        self, target: str, *args: Any, timeout_s: float | None = None, **kwargs: Any
    ) -> tuple[Any, float]:
        start = time.perf_counter_ns()
        result = self.call(target, *args, timeout_s=timeout_s, **kwargs)
        return result, (time.perf_counter_ns() - start) / 1e9


def task(name: str) -> Task:
    return load_task(BUNDLED / name)


def workspace_copy(t: Task, dest: Path, patch_file: str | None = None) -> Path:
    """Copy the task's workspace to `dest`, applying `patch_file` (in the task folder) if given."""
    shutil.copytree(t.workspace, dest)
    if patch_file:
        subprocess.run(["git", "apply", str(t.root / patch_file)], cwd=dest, check=True)
    return dest


def make_arm(
    t: Task, root: Path, name: str = "baseline", knobs: dict[str, Any] | None = None, **params: Any
) -> tuple[Harness, Arm]:
    """A harness and an arm whose worker runs `root`'s code in-process."""
    import importlib.util

    all_params = {**t.manifest.params, **params}
    spec = importlib.util.spec_from_file_location(f"harness_{t.name}_{id(root)}", t.harness_path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    harness = getattr(module, t.manifest.harness_class)(t.manifest, all_params)
    effective = {k: v.default for k, v in t.manifest.knobs.items()} | (knobs or {})
    worker = InProcessWorker(root)
    arm = Arm(name=name, sandbox=None, knobs=effective, params=all_params)  # type: ignore[arg-type]
    arm._worker = worker
    return harness, arm
