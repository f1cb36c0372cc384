"""The `server_steps` tool on the real SGLang server (sglang-cpu-tiny, CPU, tiny model): the
baseline caps running requests at 4, so a burst of 16 requests queues behind those 4 and the
report's first line says so, with the cap and the decode step time.

Needs the SGLang environment (`python -m infra_agent.serving.env --ensure`); one server start
(20-60 s on an idle 2-core machine) and a 16-request workload.
"""

from __future__ import annotations

import json

from support import sglang_server_marks

from infra_agent.tools.context import ToolContext
from infra_agent.tools.registry import default_registry

pytestmark = sglang_server_marks(timeout_s=1200)


def test_server_steps_shows_the_baselines_queue_behind_the_cap_of_4(
    tiny_looks: ToolContext,
) -> None:
    """Over 60 s on a 2-core machine: it starts the look server (conftest.py's `tiny_looks`)
    that the server_profile test then reuses."""
    ctx = tiny_looks
    args = {"num_prompts": 16, "input_len": 48, "output_len": 12}
    result = default_registry().call("server_steps", json.dumps(args), ctx)
    print(result.content)
    assert result.error is None, result.content
    first = result.content.splitlines()[0]
    assert first.startswith("queueing: up to "), first
    assert "behind 4 running (max-running-requests 4)" in first, first
    assert "ms median at 4 running" in first, first
    data = result.data
    assert data is not None
    assert data["cap"] == 4 and data["running_max"] == 4
    assert data["queued_max"] >= 8  # 16 sent at once, at most 4 admitted
    assert data["queued_at_cap_steps"] >= 0.3 * data["decode_steps"]
    assert data["decode_steps"] >= 16 and data["prefill_steps"] >= 4
    assert data["ms_clock"] and data["decode_ms_median"] > 0
    assert "4" in {str(k) for k in data["decode_ms_by_running"]}
    assert len(result.content) < 2500 and len(result.content.splitlines()) <= 20
