"""What each test file costs in CPU-seconds, every process it starts included (issue 37).

Wall time under pytest-xdist says little about what a test costs a loaded machine: a test that
waits on a server for a minute costs little, one that starts three servers costs a lot. Each test
here runs in its own cpuacct cgroup (cgroup v1, which counts a cgroup's descendants too), so every
process it starts (SGLang servers, sandboxes, Ray nodes, Chromium) is charged to it, also after
the test ends (a module's shared server to the test that started it). Docker containers run in
the engine's own cgroups and are not counted.

    .venv/bin/python -m pytest -q -n 2 --dist loadgroup -p cpu_report   # writes CPU_REPORT_DIR
    .venv/bin/python tests/cpu_report.py [CPU_REPORT_DIR]               # the table, by file

Needs root and cgroup v1's cpuacct (this machine has both); elsewhere it says so and does
nothing. The folder is `CPU_REPORT_DIR` (default /tmp/infra-agent-cpu-report).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
OUT = Path(os.environ.get("CPU_REPORT_DIR", "/tmp/infra-agent-cpu-report"))
_tests: list[tuple[str, Path, float]] = []
"""(node id, its cgroup, wall seconds) of each test this process ran."""


def _root() -> Path | None:
    if os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage").exists():
        return None
    return CPUACCT / f"pytest-cpu-{os.getpid()}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    root = _root()
    if root is None:
        yield
        return
    group = root / str(len(_tests))
    group.mkdir(parents=True, exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    start = time.monotonic()
    yield
    _tests.append((item.nodeid, group, time.monotonic() - start))


def pytest_sessionfinish(session: pytest.Session) -> None:
    root = _root()
    if root is None:
        print("cpu_report: needs root and cgroup v1's cpuacct; nothing measured", file=sys.stderr)
        return
    if not _tests:
        return
    (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))  # leave, so the folders can go
    OUT.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with (OUT / f"{worker}.jsonl").open("w") as f:
        for nodeid, group, wall in _tests:
            cpu = int((group / "cpuacct.usage").read_text()) / 1e9
            f.write(json.dumps({"test": nodeid, "cpu_s": cpu, "wall_s": wall}) + "\n")
    # Deepest first: the cgroups the product made inside a test's (a server's, empty by now),
    # then the tests', then the root. One a process still runs in is refused and kept.
    for folder in sorted(root.rglob("*/"), key=lambda f: len(f.parts), reverse=True) + [root]:
        try:
            folder.rmdir()
        except OSError:
            pass


def table(folder: Path, top: int = 30) -> str:
    """CPU-seconds and wall seconds by test file, the costliest first, with the running share."""
    rows = [json.loads(line) for p in sorted(folder.glob("*.jsonl")) for line in p.open()]
    if not rows:
        return f"no measurements in {folder} (run pytest with -p cpu_report first)"
    cpu: Counter[str] = Counter()
    wall: Counter[str] = Counter()
    for r in rows:
        name = r["test"].split("::")[0]
        cpu[name] += r["cpu_s"]
        wall[name] += r["wall_s"]
    total = sum(cpu.values())
    lines = [f"{total:.0f} CPU-seconds over {len(rows)} tests; by file, the costliest first:"]
    lines.append(f"{'CPU s':>7} {'wall s':>7} {'cum':>5}  file")
    running = 0.0
    for name, c in cpu.most_common(top):
        running += c
        lines.append(f"{c:7.0f} {wall[name]:7.0f} {running / total:5.0%}  {name}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
