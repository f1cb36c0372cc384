"""The host a run executes on: package versions, hardware and the sandbox backend.

The agent runner calls `capture_environment(backend)` when a run starts and keeps the result in
`RunRecord.environment`; exports show it (a run that recorded none exports `recorded=False`,
never the exporting machine's environment).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

from infra_agent.sandboxes.registry import BACKENDS
from infra_agent.store.records import Hardware, RuntimeEnvironment, SandboxInfo

DEFAULT_PACKAGES = (
    "infra-agent", "torch", "numpy", "sglang", "flashinfer-python", "triton", "transformers",
    "openai", "pydantic", "langgraph",
)  # fmt: skip


def _cpu_name() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return round(pages * page_size / 2**30, 2)


def _gpus(timeout_s: float = 5.0) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split(" (UUID")[0].strip() for line in out.stdout.splitlines() if line.strip()]


def capture_environment(
    backend: str, packages: tuple[str, ...] = DEFAULT_PACKAGES
) -> RuntimeEnvironment:
    """Package versions (installed ones only), Python, OS and hardware of this process's machine,
    and whether the sandbox `backend` can isolate candidates here (its probe)."""
    versions: dict[str, str] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return RuntimeEnvironment(
        python=sys.version.split()[0],
        platform=platform.platform(),
        packages=versions,
        hardware=Hardware(
            cpu=_cpu_name(), cpu_count=os.cpu_count(), memory_gib=_memory_gib(), gpus=_gpus()
        ),
        sandbox=SandboxInfo(
            backend=backend,
            problem=BACKENDS[backend].probe() if backend in BACKENDS else "unknown backend",
        ),
    )
