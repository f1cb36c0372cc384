"""Instruments run against a live SGLang server's processes while a workload runs.

    roles = server_processes(server)            # {'scheduler': pid, 'detokenizer': pid, ...}
    with LoadRun(server, sessions, load) as run: # the workload on a thread of its own
        trace = trace_pid(roles["scheduler"], duration_s=4)
    run.result                                   # the WorkloadResult (the block's end joins it)

(A profile of the whole workload attaches before it starts: `tracing.trace_during`.)

The processes are told apart by the titles SGLang gives them (`sglang::scheduler`,
`sglang::detokenizer`); the HTTP front end and tokenizer is the process that runs
`sglang.launch_server`.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from infra_agent.sandboxes.proctree import descendants
from infra_agent.serving.load.datasets import Session
from infra_agent.serving.load.generator import LoadSpec, WorkloadResult, run_workload
from infra_agent.serving.server import Server

ROLE_TITLES = {"sglang::scheduler": "scheduler", "sglang::detokenizer": "detokenizer"}


def server_processes(server: Server) -> dict[str, int]:
    """Role -> pid of the server's SGLang processes ('scheduler', 'detokenizer', 'tokenizer')."""
    if server.proc is None:
        return {}
    roles: dict[str, int] = {}
    for pid in sorted(descendants(server.proc.pid) | {server.proc.pid}):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        head = argv[0].decode(errors="replace").strip()
        for title, role in ROLE_TITLES.items():
            if head.startswith(title):
                roles.setdefault(role, pid)
        if b"sglang.launch_server" in argv and "python" in Path(head).name:
            roles.setdefault("tokenizer", pid)
    return roles


def run_counted(server: Any, sessions: list[Session], load: LoadSpec) -> WorkloadResult:
    """`run_workload` against `server` (a `serving.server.Server`: through its `call`), with the
    CPU seconds its processes used meanwhile in `server_cpu_s` (0 where it counts none)."""
    before = server.cpu_seconds()
    result: WorkloadResult = server.call(run_workload, sessions, load)
    result.server_cpu_s = server.cpu_seconds() - before
    return result


class LoadRun:
    """A workload against `server` on a thread of its own (`with`: started and joined)."""

    def __init__(self, server: Server, sessions: list[Session], load: LoadSpec) -> None:
        self.server, self.sessions, self.load = server, sessions, load
        self.result: WorkloadResult | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="infra-agent-load", daemon=True)

    def _run(self) -> None:
        try:
            self.result = run_counted(self.server, self.sessions, self.load)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the caller's thread
            self.error = exc

    def __enter__(self) -> LoadRun:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._thread.join()
        if exc is None and self.error is not None:
            raise self.error

    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.result.records) if self.result else 0


def describe(result: Any) -> str:
    """One line about a workload run: requests, output tokens (with the range per request: the
    task's workloads draw each request's length, as SGLang's bench_serving random dataset does,
    so 32 requests of 'output_len 32' carry about 24 each), seconds."""
    if result is None:
        return "no workload result"
    counts = [r.output_tokens for r in result.records]
    tokens = sum(counts)
    spread = f" ({min(counts)}-{max(counts)} per request)" if counts else ""
    rate = f", {tokens / result.duration_s:.0f} tok/s" if result.duration_s > 0 else ""
    if cpu_s := getattr(result, "server_cpu_s", None):  # counted around it (run_counted)
        rate += f", {tokens / cpu_s:.0f} tok per server CPU-s"
    return (
        f"{len(result.records)} requests, {tokens} output tokens{spread} in "
        f"{result.duration_s:.1f} s{rate}"
    )
