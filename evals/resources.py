"""What one attempt asks a Ray cluster for, read from its task (`eval --executor ray`).

An attempt is one Ray task that runs every experiment of its run, so it asks for what its
largest experiment holds at once:
- a Python task: one core (baseline and candidate run one after the other in one worker) and
  the candidate's memory cap (`[budget] memory_mb`) beside the attempt process itself;
- a serving task: both arms' servers are up together (one is frozen while the other is
  measured), so each arm's compute threads (`OMP_NUM_THREADS` in `deployment.toml`, 1 when
  unset) twice plus one core for the load generator and the agent, the memory cap per arm, and
  the GPUs the deployment asks for (`gpus`; the arms are measured one at a time on them).
Ray places a task only where all of it is free, so CPU and GPU attempts share one cluster
without oversubscribing a node.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from infra_agent.tasks.manifest import Task

ATTEMPT_PROCESS_MB = 768
"""The attempt's own process (agent, graph, store, imports): about 300-500 MB resident here."""


class AttemptResources(BaseModel):
    """One attempt's request, and why."""

    cpus: float
    memory_mb: int
    gpus: int = 0
    why: str

    def ray_options(self) -> dict[str, Any]:
        """`num_cpus`, `num_gpus` and `memory` (bytes) for `ray.remote(...).options`."""
        return {"num_cpus": self.cpus, "num_gpus": self.gpus, "memory": self.memory_mb << 20}

    def requested(self) -> dict[str, float]:
        """The same, as stored with each try (memory in bytes, as Ray counts it)."""
        return {"CPU": self.cpus, "GPU": float(self.gpus), "memory": float(self.memory_mb << 20)}


def attempt_resources(task: Task) -> AttemptResources:
    """What an attempt of `task` needs while its largest experiment runs."""
    cap = task.manifest.budget.memory_mb
    if task.manifest.kind != "serving":
        return AttemptResources(
            cpus=1, memory_mb=ATTEMPT_PROCESS_MB + cap,
            why=f"python task: 1 core (arms in turn), {cap} MB candidate cap",
        )  # fmt: skip
    from infra_agent.serving.deployment import load_deployment

    spec_path = task.root / "deployment.toml"
    spec = load_deployment(spec_path) if spec_path.is_file() else None
    threads = int((spec.env if spec else {}).get("OMP_NUM_THREADS", "1") or 1)
    gpus = spec.gpus if spec else 0
    return AttemptResources(
        cpus=2 * threads + 1,
        memory_mb=ATTEMPT_PROCESS_MB + 2 * cap,
        gpus=gpus,
        why=(f"serving task: 2 arms x {threads} server thread(s) + 1 core, 2 x {cap} MB"
             + (f", {gpus} GPU(s)" if gpus else "")),
    )  # fmt: skip
