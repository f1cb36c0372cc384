"""The GPU example deployment: same harness, GPU-only parts refused with a reason on a CPU."""

from pathlib import Path

import pytest

from infra_agent.errors import UserError
from infra_agent.experiments.arms import effective_params, load_harness
from infra_agent.serving.knobs import CATALOGUE, check_device
from infra_agent.serving.launch import gpu_count
from infra_agent.serving.server import ServerFailed
from infra_agent.tasks.harness import Arm
from infra_agent.tasks.patch import effective_knobs
from infra_agent.tasks.registry import find_task

TASK = find_task("sglang-gpu-example")


def test_example_uses_the_serving_harness_and_catalogue_knobs() -> None:
    harness = load_harness(TASK, effective_params(TASK.manifest, None))
    assert harness.deployment.gpus == 8
    assert harness.deployment.server_args["tp-size"] == 8
    for name, knob in TASK.manifest.knobs.items():
        assert knob.needs_gpu == CATALOGUE[name].needs_gpu


@pytest.mark.skipif(gpu_count() >= 8, reason="this machine has the GPUs: the live path applies")
def test_prepare_without_the_gpus_stops_with_the_reason(tmp_path: Path) -> None:
    harness = load_harness(TASK, effective_params(TASK.manifest, None))

    class NoSandbox:
        root = tmp_path

    arm = Arm(
        name="baseline", sandbox=NoSandbox(), knobs=effective_knobs(None, TASK.manifest), params={}
    )  # type: ignore[arg-type]
    with pytest.raises(
        ServerFailed, match="needs 8 GPU\\(s\\), this machine has .*GPU-only deployment skipped"
    ):
        harness.prepare(arm)


@pytest.mark.skipif(gpu_count() > 0, reason="this machine has a GPU")
def test_gpu_only_knob_changes_are_refused_on_cpu() -> None:
    knobs = effective_knobs(None, TASK.manifest) | {"hicache-ratio": 4.0}
    with pytest.raises(UserError, match="hicache-ratio needs a GPU"):
        check_device(knobs, TASK.manifest.knobs, gpu=False)
    check_device(effective_knobs(None, TASK.manifest), TASK.manifest.knobs, gpu=False)
