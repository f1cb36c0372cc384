"""The un-injected engine: the task's deployment on the installed SGLang package, as a reference.

An accuracy task is judged by its distance to what the engine computes without the task's
fault, as a python task is judged against a float64 reference: the harness starts this server
itself (no overlay, no candidate code, default knobs), in its own folder, when a measure first
needs it, and stops it when the last arm finishes. Its answers to a prompt set are kept per seed.

    engine = ReferenceEngine(deployment)
    answers = engine.answers(prompts, gate_config, seed)     # list[Answer], cached per seed
    engine.stop()
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from infra_agent.serving.deployment import DeploymentSpec
from infra_agent.serving.harness.accuracy import Answer, GateConfig, answer
from infra_agent.serving.server import Server


class ReferenceEngine:
    """A lazily started server of the installed SGLang (see the module docstring)."""

    def __init__(self, deployment: DeploymentSpec, knobs: dict[str, Any] | None = None) -> None:
        self.deployment = deployment
        self.knobs = dict(knobs or {})
        self._server: Server | None = None
        self._folder: Path | None = None
        self._lock = threading.Lock()
        self._answers: dict[tuple[int, int, bool], list[Answer]] = {}

    def server(self) -> Server:
        with self._lock:
            if self._server is None or not self._server.alive():
                if self._server is not None:
                    self._server.stop()
                self._folder = Path(tempfile.mkdtemp(prefix="infra-agent-reference-"))
                self._server = Server.start(
                    self.deployment,
                    self._folder,
                    knobs=self.knobs,
                    model_cache=self._folder / "models",
                )
            return self._server

    def answers(
        self, prompts: list[list[int]], config: GateConfig, seed: int, *, sampled: bool = False
    ) -> list[Answer]:
        """Answers with top-k log-probs to `prompts` (greedy, or sampled with seeds derived from
        `seed`; cached by seed, size and mode)."""
        key = (seed, len(prompts), sampled)
        if key not in self._answers:
            self._answers[key] = self.server().call(
                answer, prompts, config, sampling_seed=seed if sampled else None
            )
        return self._answers[key]

    def stop(self) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop()
                self._server = None
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
                self._folder = None
