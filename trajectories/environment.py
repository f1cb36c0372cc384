"""The environment a run executed in: package versions, hardware, and how to find it again.

The agent calls `capture_environment()` when a run starts and keeps the result in
`RunRecord.config["environment"]` (as JSON); the exporter reads it back with
`recorded_environment(run)`. A run that did not record one exports `recorded=False` rather
than the exporting machine's environment, which would be wrong.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from typing import Any

from pydantic import BaseModel, Field, ValidationError

ENVIRONMENT_KEY = "environment"
"""Key in `RunRecord.config` under which the run's `RuntimeEnvironment` is kept."""

DEFAULT_PACKAGES = (
    "infra-agent", "torch", "numpy", "sglang", "flashinfer-python", "triton", "transformers",
    "openai", "pydantic", "langgraph",
)  # fmt: skip


class Hardware(BaseModel):
    cpu: str | None = None
    """CPU model name."""
    cpu_count: int | None = None
    """Logical CPUs visible to the process."""
    memory_gib: float | None = None
    """Total physical memory, GiB."""
    gpus: list[str] = Field(default_factory=list)
    """GPU names as `nvidia-smi -L` reports them (empty when none or unknown)."""


class RuntimeEnvironment(BaseModel):
    """Where a run executed (captured at run start)."""

    recorded: bool = True
    """False when the run stored no environment (then the other fields are empty)."""
    python: str | None = None
    platform: str | None = None
    packages: dict[str, str] = Field(default_factory=dict)
    """Distribution name -> version, for the packages that decide performance."""
    hardware: Hardware = Field(default_factory=Hardware)


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


def capture_environment(packages: tuple[str, ...] = DEFAULT_PACKAGES) -> RuntimeEnvironment:
    """Package versions (installed ones only), Python, OS and hardware of this process's machine."""
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
    )


def recorded_environment(config: dict[str, Any]) -> RuntimeEnvironment:
    """The environment a run stored in its config, or `recorded=False` when absent or malformed."""
    raw = config.get(ENVIRONMENT_KEY)
    if isinstance(raw, dict):
        try:
            return RuntimeEnvironment.model_validate(raw)
        except ValidationError:
            pass
    return RuntimeEnvironment(recorded=False)
