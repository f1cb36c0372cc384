"""Setting up the two arms of an experiment: the trusted harness, one sandbox per arm, the RPC
workers, the run's scale parameters, and fresh seeds the candidate never sees."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from infra_agent.errors import UserError
from infra_agent.experiments.rule_groups import AUDITED_GROUPS, normalize_allow
from infra_agent.experiments.worker import RpcWorker
from infra_agent.sandboxes.base import Sandbox, SandboxSpec
from infra_agent.tasks.checked import CheckedPatch, checked
from infra_agent.tasks.harness import Arm, Harness
from infra_agent.tasks.manifest import Task, TaskManifest
from infra_agent.tasks.patch import DEFAULT_MAX_PATCH_BYTES, Patch

PACKAGE_DIR = Path(__file__).resolve().parents[1]
SANDBOX_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
"""One compute thread per arm: both arms get the same CPU share, and a candidate cannot win by
using cores the baseline does not."""


def effective_params(manifest: TaskManifest, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The task's default scale parameters overlaid with `overrides` (strings from the command
    line are converted to the default's type). Unknown names are a UserError."""
    params = dict(manifest.params)
    for name, value in (overrides or {}).items():
        if name not in params:
            known = ", ".join(sorted(params)) or "none"
            raise UserError(f"task {manifest.name} has no parameter '{name}' (parameters: {known})")
        params[name] = _coerce(name, value, params[name])
    return params


def _coerce(name: str, value: Any, default: Any) -> Any:
    if not isinstance(value, str) or isinstance(default, str):
        return value
    try:
        if isinstance(default, bool):
            if value.lower() not in ("true", "false"):
                raise ValueError
            return value.lower() == "true"
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
    except ValueError:
        raise UserError(
            f"parameter '{name}': {value!r} is not a {type(default).__name__}"
        ) from None
    return value


def sandbox_spec(task: Task) -> SandboxSpec:
    budget = task.manifest.budget
    return SandboxSpec(
        network=False,
        memory_mb=budget.memory_mb,
        cpu_time_s=budget.cpu_time_s,
        env=dict(SANDBOX_ENV),
        hidden_paths=[task.root, PACKAGE_DIR],
    )


def load_harness(task: Task, params: dict[str, Any]) -> Harness:
    """Import the task's harness module (trusted code, in this process) and instantiate it."""
    digest = hashlib.sha256(str(task.harness_path).encode()).hexdigest()[:12]
    name = f"infra_agent_task_harness_{task.name.replace('-', '_').replace('.', '_')}_{digest}"
    spec = importlib.util.spec_from_file_location(name, task.harness_path)
    if spec is None or spec.loader is None:
        raise UserError(f"{task.harness_path}: cannot be imported as a harness")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise UserError(
            f"{task.harness_path}: fails to import ({type(exc).__name__}: {exc})"
        ) from exc
    cls = getattr(module, task.manifest.harness_class, None)
    if not (isinstance(cls, type) and issubclass(cls, Harness)):
        raise UserError(
            f"{task.harness_path}: no Harness subclass named '{task.manifest.harness_class}'"
        )
    return cls(task.manifest, params)


class ArmStartError(Exception):
    """A worker could not start (its arm's name and the cause)."""

    def __init__(self, arm: str, error: BaseException) -> None:
        super().__init__(f"{arm}: {error}")
        self.arm = arm
        self.error = error


def preload_modules(task: Task) -> list[str]:
    """Heavy modules the workspace imports, loaded when a worker starts (only torch for now).
    Only python tasks have workers; a serving task's workspace is a package its server runs."""
    if task.manifest.kind != "python" or not task.workspace.is_dir():
        return []
    for path in task.workspace.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "import torch" in text or "from torch" in text:
            return ["torch"]
    return []


def arm_set(task: Task) -> ArmSet:
    """The arms of one experiment on `task`, with its worker settings."""
    return ArmSet(
        task.manifest.budget.call_timeout_s,
        preload_modules(task),
        worker_guard(task),
        inplace=task.manifest.inplace,
        background="background" in normalize_allow(task.manifest.allow),
    )


def worker_guard(task: Task) -> dict[str, list[str]]:
    """The worker's audit-hook configuration: rule groups the task does not allow, and paths
    (the task folder, the package) candidate code may never open."""
    allowed = normalize_allow(task.manifest.allow)
    return {
        "deny": sorted(AUDITED_GROUPS - allowed),
        "forbidden": [str(task.root), str(PACKAGE_DIR)],
        "exempt": sorted({sys.prefix, sys.base_prefix}),
    }


class SeedSource:
    """Fresh 63-bit seeds from os.urandom: unpredictable to the candidate, never repeated, never
    equal to a warm-up seed."""

    def __init__(self) -> None:
        self.used: set[int] = set()

    def fresh(self) -> int:
        while True:
            seed = int.from_bytes(os.urandom(8), "big") >> 1
            if seed not in self.used:
                self.used.add(seed)
                return seed


class ArmSet:
    """The sandboxes and workers of one experiment; `close()` releases all of them."""

    def __init__(
        self,
        call_timeout_s: float,
        preload: list[str] | None = None,
        guard: dict[str, list[str]] | None = None,
        *,
        inplace: bool = False,
        background: bool = False,
    ) -> None:
        self.call_timeout_s = call_timeout_s
        self.preload = preload or []
        self.guard = guard or {}
        self.inplace = inplace
        self.background = background
        self.sandboxes: list[Sandbox] = []
        self.workers: list[RpcWorker] = []

    def worker_factory(self, arm: Arm) -> RpcWorker:
        # /tmp is writable only where the sandbox gives it a private one.
        private_tmp = any(item.startswith("tmp:private") for item in arm.sandbox.isolation()[0])
        writable = [str(arm.sandbox.root), "/dev/null"] + (["/tmp"] if private_tmp else [])
        guard = {**self.guard, "writable": writable}
        worker = RpcWorker(
            arm.sandbox,
            call_timeout_s=self.call_timeout_s,
            preload=self.preload,
            guard=guard,
            inplace=self.inplace,
            background=self.background,
        )
        self.workers.append(worker)
        return worker

    def start_workers(self, arms: list[Arm]) -> None:
        """Start the arms' workers side by side (each imports its preloads on its own)."""
        with ThreadPoolExecutor(len(arms)) as pool:
            started = list(pool.map(lambda arm: (arm, self._try_start(arm)), arms))
        for arm, outcome in started:
            if isinstance(outcome, BaseException):
                raise ArmStartError(arm.name, outcome)
            arm._worker = outcome

    def _try_start(self, arm: Arm) -> RpcWorker | BaseException:
        try:
            return self.worker_factory(arm)
        except Exception as exc:  # noqa: BLE001 - reported per arm by the caller
            return exc

    def open(
        self, name: Any, sandbox: Sandbox, knobs: dict[str, Any], params: dict[str, Any]
    ) -> Arm:
        self.sandboxes.append(sandbox)
        return Arm(
            name=name,
            sandbox=sandbox,
            knobs=knobs,
            params=params,
            worker_factory=self.worker_factory,
        )

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.close()
            except Exception:  # noqa: BLE001 - cleanup must reach every sandbox
                pass
        for sandbox in self.sandboxes:
            sandbox.cleanup()


def patch_refusal(
    patch: Patch | CheckedPatch, task: Task, max_bytes: int = DEFAULT_MAX_PATCH_BYTES
) -> str | None:
    """Why `task` cannot take `patch` at all (it cannot be applied to a copy, or its diff is over
    `max_bytes`: the configured `sandbox.max_patch_bytes`), or None. A patch touching a
    non-editable file is judged by the cascade (a rule, also REJECTED). A checked patch's check
    is read, not repeated; a plain one is checked here."""
    found = checked(patch, task)
    size = len(found.patch.diff.encode())  # 0 for a knob assignment
    if size > max_bytes:
        return f"patch is {size} bytes, above the limit of {max_bytes}"
    if found.refusal is None or found.not_editable:
        return None
    return str(found.refusal)
