"""Fixtures for the serving tests that share real SGLang servers (a start is 40-90 s of two
busy cores on a 2-core machine, minutes on a loaded one):

- `tiny_looks`: one run's tool context on the embedded default target, shared by the live
  `server_steps` and `server_profile` tests so that they look at one baseline server (a look
  server is kept for the run, `tools.looks`: the second look costs its workload, not a start);
- `tiny_baseline`: one unpatched sglang-cpu-tiny server with the task's baseline knobs, lent to
  the baseline arm of every sglang-cpu-tiny experiment of the tests that use it (the knob
  experiment, each cheating server of test_judge_adversarial.py) and to the tests that only read
  a server (`tiny_server`). Only the baseline is lent: each candidate's server starts from its
  own patch, as in any experiment. Between uses the server is paused (no CPU: an idle SGLang
  scheduler polls about 0.8 cores).

Each stops once the last test in a row that uses it has finished (tests/conftest.py keeps those
tests together, on one xdist worker).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra_agent.serving.deployment import load_deployment
from infra_agent.serving.harness import ServingHarness
from infra_agent.serving.overlay import changed_modules
from infra_agent.serving.server import Server
from infra_agent.store import open_store
from infra_agent.tasks.harness import Arm
from infra_agent.tasks.patch import effective_knobs
from infra_agent.tasks.registry import find_task
from infra_agent.tools.context import ToolContext

TINY = "sglang-cpu-tiny"


RELEASE = pytest.StashKey[dict[str, Callable[[], None]]]()
"""Shared fixture name -> what stops its server (`pytest_runtest_teardown` below)."""


def _on_release(config: pytest.Config, name: str, release: Callable[[], None]) -> None:
    config.stash.setdefault(RELEASE, {})[name] = release


@pytest.fixture(scope="session")
def tiny_looks(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[ToolContext]:
    """A run's tool context on sglang-cpu-tiny; its look servers stop after the last test in a
    row that uses it (a later look would start one again)."""
    folder = tmp_path_factory.mktemp("tiny-looks")
    ctx = ToolContext(task=find_task(TINY), store=open_store(folder / "runs.db"), run_id="r")
    _on_release(pytestconfig, "tiny_looks", ctx.close)
    yield ctx
    ctx.close()


class KeptBaseline:
    """sglang-cpu-tiny's baseline server, started on first use and kept until `stop()`."""

    def __init__(self, folder: Path) -> None:
        task = find_task(TINY)
        self.folder = folder
        self.spec = load_deployment(task.root / "deployment.toml")
        self.knobs: dict[str, Any] = effective_knobs(None, task.manifest)
        """The baseline arm's knobs (the task's defaults), as the harness passes them."""
        self.starts = 0
        self._server: Server | None = None

    def server(self) -> Server:
        """The kept server, started (again) when it is not running."""
        if self._server is None or not self._server.alive():
            self.stop()
            self.starts += 1
            workdir = self.folder / f"start-{self.starts}"
            self._server = Server.start(self.spec, workdir, knobs=self.knobs)
            print(f"kept sglang-cpu-tiny baseline ready in {self._server.ready_s:.1f} s")
        return self._server

    def holds(self, server: Server | None) -> bool:
        """Whether `server` is the kept one."""
        return server is not None and server is self._server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            shutil.rmtree(self._server.workdir, ignore_errors=True)
            self._server = None

    def lends_to(self, harness: ServingHarness, arm: Arm) -> bool:
        """Whether `arm` is an experiment's baseline that this server is: sglang-cpu-tiny's
        deployment, its default knobs, the installed SGLang unchanged (its workspace holds the
        files the candidate's patch touches, as they are installed)."""
        return (
            arm.name == "baseline"
            and harness.deployment == self.spec
            and harness.server_args(arm) == self.knobs
            and not changed_modules(
                workspace := Path(arm.sandbox.root),
                harness.overlay_files(workspace),
                self.spec.sglang_version,
            )
        )


@pytest.fixture(scope="session")
def tiny_baseline(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[KeptBaseline]:
    kept = KeptBaseline(tmp_path_factory.mktemp("tiny-baseline"))
    _on_release(pytestconfig, "tiny_baseline", kept.stop)
    yield kept
    kept.stop()


@pytest.fixture
def lent_baseline(tiny_baseline: KeptBaseline, monkeypatch: pytest.MonkeyPatch) -> KeptBaseline:
    """Experiments in this test get the kept server as their baseline arm's: the harness's
    `prepare` gets it in place of a start (and still warms it up, as any baseline), `finish`
    pauses it in place of a stop. The candidate arm is untouched."""
    prepare, finish, start = ServingHarness.prepare, ServingHarness.finish, Server.start
    lending: list[Server] = []

    def lent_start(*args: Any, **kwargs: Any) -> Server:
        return lending.pop() if lending else start(*args, **kwargs)

    def lending_prepare(self: ServingHarness, arm: Arm) -> None:
        if tiny_baseline.lends_to(self, arm):
            lending.append(tiny_baseline.server())
        try:
            prepare(self, arm)
        finally:
            lending.clear()

    def keeping_finish(self: ServingHarness, arm: Arm) -> None:
        if tiny_baseline.holds(arm.state.get("server")):
            server = arm.state.pop("server")
            if server.alive():
                server.pause()
        finish(self, arm)

    monkeypatch.setattr(Server, "start", lent_start)
    monkeypatch.setattr(ServingHarness, "prepare", lending_prepare)
    monkeypatch.setattr(ServingHarness, "finish", keeping_finish)
    return tiny_baseline


@pytest.fixture
def tiny_server(tiny_baseline: KeptBaseline) -> Iterator[Server]:
    """The kept baseline server, running for this test (paused again after it)."""
    server = tiny_baseline.server()
    server.resume()
    yield server
    if server.alive():
        server.pause()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop a shared server after the last test in a row that uses it: paused, it still holds
    2-3 GB."""
    following = getattr(nextitem, "fixturenames", ())
    for name, release in item.config.stash.get(RELEASE, {}).items():
        if name in getattr(item, "fixturenames", ()) and name not in following:
            release()
