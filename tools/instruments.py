"""Instrument tools: thin adapters over `feedback/` (profiles, accuracy diffs, microbenchmarks,
GIL traces, serving workloads) that run against the task's workspace, baseline or patched."""

from __future__ import annotations

from infra_agent.tools.base import Tool

INSTRUMENT_TOOLS: list[Tool] = []  # type: ignore[type-arg]
