"""Test equipment for the agent tests: the stand-in for the paid model endpoint (a real HTTP
server on 127.0.0.1, `paid_endpoint.py`), and a quick copy of a bundled task (same code and
harness, smaller measurement budget)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from paid_endpoint import PaidEndpointStandIn


@pytest.fixture
def paid_endpoint() -> Iterator[PaidEndpointStandIn]:
    """The test stand-in for the paid model endpoint, shaped like Z.ai's API."""
    endpoint = PaidEndpointStandIn()
    yield endpoint
    endpoint.close()


@pytest.fixture
def quick_task(tmp_path: Path) -> Path:
    """decode-split-norm with a smaller problem and measurement budget (same code and harness)."""
    from support import quick_decode_task

    return quick_decode_task(tmp_path)
