"""Reviewer sessions end: on sign-out, after the idle timeout, and at the maximum age; an ended
session's cookie opens nothing and changes nothing. Driven through the real FastAPI app with a
clock the test moves (no sleeping)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from infra_agent.review.web import Address, ReviewerAuth, server_for
from infra_agent.review.web.app import create_app

TOKEN = "tok-" + "r" * 20
ADDRESS = Address("r-test.localhost", 8765, checked=True)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _client(tmp_path: Path, clock: Clock, **lifetimes: float) -> TestClient:
    auth = ReviewerAuth({"alice": TOKEN}, clock=clock, **lifetimes)
    server = server_for(tmp_path / "runs.db", auth, address=ADDRESS)
    return TestClient(create_app(server), base_url=ADDRESS.origin, follow_redirects=False)


def _sign_in(client: TestClient) -> str:
    assert client.get(f"/proposals?token={TOKEN}").status_code == 303
    page = client.get("/proposals")
    assert page.status_code == 200 and "signed in as <b>alice</b>" in page.text
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert found is not None
    return found.group(1)


def test_idle_session_ends_and_a_request_keeps_it_alive(tmp_path: Path) -> None:
    clock = Clock()
    client = _client(tmp_path, clock, idle_timeout_s=600, max_age_s=86400)
    _sign_in(client)
    clock.now += 590
    assert client.get("/proposals").status_code == 200  # 590 s idle: still on, and refreshed
    clock.now += 590
    assert client.get("/proposals").status_code == 200
    clock.now += 601
    refused = client.get("/proposals")
    assert refused.status_code == 401 and "session ended" in refused.text
    clock.now -= 601  # the clock going back does not revive a forgotten session
    assert client.get("/proposals").status_code == 401


def test_session_ends_at_its_maximum_age_however_busy(tmp_path: Path) -> None:
    clock = Clock()
    client = _client(tmp_path, clock, idle_timeout_s=600, max_age_s=1800)
    _sign_in(client)
    for _ in range(5):
        clock.now += 300
        assert client.get("/proposals").status_code == 200
    clock.now += 301
    assert client.get("/proposals").status_code == 401
    _sign_in(client)  # the token starts a fresh session
    assert client.get("/proposals").status_code == 200


def test_sign_out_needs_the_csrf_token_and_ends_the_session(tmp_path: Path) -> None:
    clock = Clock()
    client = _client(tmp_path, clock)
    csrf = _sign_in(client)
    cookie = client.cookies.get("infra_agent_review")
    assert client.post("/logout", data={}).status_code == 403  # no CSRF: nothing happens
    assert client.post("/logout", data={"csrf_token": csrf + "x"}).status_code == 403
    assert client.get("/proposals").status_code == 200
    out = client.post("/logout", data={"csrf_token": csrf})
    assert out.status_code == 200 and "Signed out" in out.text
    assert client.get("/proposals").status_code == 401
    # The old cookie, replayed by someone who kept it, is dead too.
    replay = TestClient(client.app, base_url=ADDRESS.origin, cookies={"infra_agent_review": cookie})
    assert replay.get("/proposals").status_code == 401


def test_ended_sessions_are_forgotten_and_lifetimes_are_checked(tmp_path: Path) -> None:
    clock = Clock()
    auth = ReviewerAuth({"alice": TOKEN}, idle_timeout_s=10, max_age_s=100, clock=clock)
    first = auth.start_session("alice")
    clock.now += 11
    second = auth.start_session("alice")  # starting one prunes the expired ones
    assert auth.live_sessions() == 1 and auth.session(first) is None
    assert auth.session(second) is not None
    with pytest.raises(ValueError, match="positive"):
        ReviewerAuth({"alice": TOKEN}, idle_timeout_s=0)
