"""What the review server checks before it reads a request, over raw HTTP against the real
server (uvicorn in this process, on a loopback port): Host and Origin exactly this server's,
the session before any body byte, no double framing, slow clients cut off, hardened error
pages, an unreadable store row listed instead of failing the queue, a login redirect that
stays on the server, and any 127.0.0.0/8 address kept loopback."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import stoppable

from infra_agent.review.queue import submit_proposal
from infra_agent.review.web import Address, ReviewerAuth, bind, create_app, server_for
from infra_agent.review.web.gate import SECURITY_HEADERS
from infra_agent.review.web.listener import http_server
from infra_agent.store import open_store

TOKEN = "gate-token-0123456789"


@dataclass
class Live:
    """A review server running in this process."""

    address: Address
    auth: ReviewerAuth
    store_path: Path
    good: str
    """A proposal that reads fine."""
    broken: str
    """A proposal whose stored row does not parse."""

    def request(
        self, head: str, body: bytes = b"", *, host: str | None = None, keep_alive: bool = False
    ) -> bytes:
        """Send `head` (request line and headers, CRLF-joined, without Host) and `body`; return
        all the server sent until it closed or went quiet for 20 s. Without `keep_alive` the
        request asks the server to close after answering."""
        with self.connect() as conn:
            conn.sendall(self.head(head, host, keep_alive=keep_alive) + body)
            return read_all(conn)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.address.port), timeout=20)

    def head(self, head: str, host: str | None = None, *, keep_alive: bool = True) -> bytes:
        lines = [head.split("\r\n")[0], f"Host: {host or self.address.authority}"]
        lines += [line for line in head.split("\r\n")[1:] if line]
        lines += [] if keep_alive else ["Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def cookie(self, reviewer: str = "ana") -> str:
        return f"Cookie: infra_agent_review={self.auth.start_session(reviewer)}"


def read_all(conn: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except TimeoutError:
        data += b"\n<<still open after 20 s>>"
    except ConnectionResetError:
        data += b"\n<<reset>>"
    return data


def status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def closed(reply: bytes) -> bool:
    return not reply.endswith(b"<<still open after 20 s>>")


@contextmanager
def serving(store_path: Path, auth: ReviewerAuth, *, request_timeout_s: float) -> Iterator[Address]:
    """The review app under uvicorn on a free 127.0.0.1 port, in a thread, until the block ends."""
    sock = bind("127.0.0.1", 0)
    address = Address.for_bind("127.0.0.1", sock.getsockname()[1])
    uv = http_server(
        create_app(server_for(store_path, auth, address=address)),
        request_timeout_s=request_timeout_s,
    )
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert uv.started, "the review server did not start"
    try:
        yield address
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, kit: SimpleNamespace) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("review-gate")
    store = open_store(root / "runs.db")
    task = kit.make_task(root / "toy-sched")
    ids = []
    for word in ("Slicing", "Sliced"):
        patch = kit.diff_patch(kit.SCHED_DIFF.replace("Slicing", word))
        ids.append(
            submit_proposal(
                store, task=task, patch=patch, experiment=kit.experiment_for(task, patch),
                rationale=f"{word} the queue", run_id=None,
            ).id
        )  # fmt: skip
    store.close()
    with sqlite3.connect(root / "runs.db") as conn:  # a row written by a future/buggy version
        conn.execute(
            "UPDATE proposals SET body=? WHERE id=?",
            (json.dumps({"id": ids[1], "status": "from the future"}), ids[1]),
        )
    auth = ReviewerAuth({"ana": TOKEN})
    with serving(root / "runs.db", auth, request_timeout_s=15) as address:
        yield Live(address, auth, root / "runs.db", good=ids[0], broken=ids[1])


def test_the_server_answers_only_to_its_own_name(live: Live) -> None:
    assert re.fullmatch(r"r-[0-9a-f]{20}\.localhost", live.address.name)
    page = f"GET /proposals/{live.good} HTTP/1.1\r\n{live.cookie()}"
    assert status(live.request(page)) == 200
    port = live.address.port
    for host in (
        f"127.0.0.1:{port}",  # a cookie replayed to the address, by a process without the name
        f"localhost:{port}",
        f"evil@{live.address.authority}",
        f"evil@127.0.0.1:{port}",
        f"{live.address.name}:{port + 1}",
        f"r-0000.localhost:{port}",
    ):
        reply = live.request(page, host=host)
        assert status(reply) == 403 and b"is not this review server" in reply, host


def test_origin_must_be_this_server_scheme_included(live: Live) -> None:
    page = f"GET /proposals/{live.good} HTTP/1.1\r\n{live.cookie()}"
    ok = live.request(f"{page}\r\nOrigin: {live.address.origin}")
    assert status(ok) == 200
    for origin in (f"https://{live.address.authority}", "null", "http://127.0.0.1:1"):
        reply = live.request(f"{page}\r\nOrigin: {origin}")
        assert status(reply) == 403 and b"cross-origin" in reply, origin


def test_no_session_is_refused_before_the_body_is_read(live: Live) -> None:
    # 100 kB announced, 10 bytes sent: the refusal does not wait for the rest.
    head = f"POST /proposals/{live.good}/decide HTTP/1.1\r\nContent-Length: 100000\r\nContent-Type: application/x-www-form-urlencoded"
    reply = live.request(head, b"action=app", keep_alive=True)
    assert status(reply) == 401 and closed(reply)


def test_a_refused_small_body_is_dropped_and_one_that_never_comes_is_not_waited_for(
    live: Live,
) -> None:
    """A suite run lost a 403 to "connection reset by peer": the gate closed the socket with the
    form's bytes unread. A small body that has arrived is read and dropped before the refusal; one
    announced and never sent is not waited for: had the gate waited, the listener's request
    deadline would have closed the connection with no answer at all (listener._too_slow, as
    test_idle_and_slow_clients_are_disconnected shows), so the 401 itself says it did not."""
    head = f"POST /proposals/{live.good}/decide HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded"
    form = b"action=approve&patch_hash=" + b"0" * 64
    reply = live.request(f"{head}\r\nContent-Length: {len(form)}", form, keep_alive=True)
    assert status(reply) == 401 and closed(reply)
    reply = live.request(f"{head}\r\nContent-Length: 1000", b"action=app", keep_alive=True)
    assert status(reply) == 401 and closed(reply)


def test_chunked_body_with_a_length_is_refused_unread(live: Live) -> None:
    # The request: chunked and Content-Length: 10 together, a body far longer than 10.
    for cookie in ("", live.cookie()):
        with live.connect() as conn:
            conn.sendall(
                live.head(
                    f"POST /proposals/{live.good}/decide HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
                    f"Content-Length: 10\r\nContent-Type: application/x-www-form-urlencoded\r\n{cookie}"
                )
            )
            conn.sendall(b"10000\r\n" + b"a" * 0x10000 + b"\r\n")  # and no final chunk
            reply = read_all(conn)
        assert status(reply) == 400 and closed(reply), reply[:300]
        assert b"both Transfer-Encoding and Content-Length" in reply
    store = open_store(live.store_path, readonly=True)
    assert store.decisions(live.good) == []
    store.close()


def test_error_pages_carry_the_security_headers_and_no_paths(live: Live) -> None:
    replies = {
        "500": live.request(f"GET /proposals/{live.broken} HTTP/1.1\r\n{live.cookie()}"),
        "401": live.request("GET /proposals HTTP/1.1"),
        "404": live.request(f"GET /nowhere HTTP/1.1\r\n{live.cookie()}"),
        "400": live.request(
            "POST /logout HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1"
        ),
    }
    for code, reply in replies.items():
        head, _, body = reply.partition(b"\r\n\r\n")
        assert status(reply) == int(code), reply[:300]
        for name, value in SECURITY_HEADERS.items():
            assert f"{name}: {value}".lower().encode() in head.lower(), (code, name)
        assert b'id="refusal"' in body and str(live.store_path.parent).encode() not in body
    assert b"cannot be read" in replies["500"]


def test_an_unreadable_row_is_listed_and_the_queue_still_shows(live: Live) -> None:
    reply = live.request(f"GET /proposals?status=all HTTP/1.1\r\n{live.cookie()}")
    assert status(reply) == 200, reply[:500]
    page = reply.decode()
    assert f'data-proposal="{live.good}"' in page
    row = re.search(rf'<tr data-proposal="{live.broken}" class="unreadable">.*?</tr>', page, re.S)
    assert row is not None and "unreadable" in row.group(0)


def test_login_redirect_stays_on_this_server(live: Live) -> None:
    for path in ("//evil.example/x", "/\\evil.example/x", "///evil.example"):
        reply = live.request(f"GET {path}?token={TOKEN} HTTP/1.1\r\nSec-Fetch-Site: none")
        assert status(reply) == 303, reply[:300]
        location = re.search(rb"\r\nlocation: ([^\r]*)", reply, re.I)
        assert location is not None
        assert location.group(1).startswith(b"/") and location.group(1)[1:2] not in (b"/", b"\\")


@pytest.fixture
def impatient(tmp_path: Path) -> Iterator[tuple[Address, ReviewerAuth]]:
    """A server that gives a client 1 s to send a request."""
    open_store(tmp_path / "runs.db").close()
    auth = ReviewerAuth({"ana": TOKEN})
    with serving(tmp_path / "runs.db", auth, request_timeout_s=1) as address:
        yield address, auth


def test_idle_and_slow_clients_are_disconnected(impatient: tuple[Address, ReviewerAuth]) -> None:
    address, auth = impatient
    cookie = f"infra_agent_review={auth.start_session('ana')}"
    body = f"POST /logout HTTP/1.1\r\nHost: {address.authority}\r\nCookie: {cookie}\r\nContent-Length: 50\r\n\r\n"
    starts = (
        b"",  # connected, never sends
        b"GET /proposals HTTP/1.1\r\nHost: ",  # a head that stops
        body.encode() + b"csrf",  # a signed-in reviewer's body that stops
    )
    conns = [socket.create_connection(("127.0.0.1", address.port), timeout=20) for _ in starts]
    for conn, start in zip(conns, starts, strict=True):  # all three wait at once
        conn.sendall(start)
    for conn in conns:
        with conn:
            assert closed(read_all(conn))


def test_any_127_address_keeps_the_host_check_and_no_warning(tmp_path: Path) -> None:
    """`review serve --host 127.0.0.2`: loopback, so its Host is checked and nothing says it is
    reachable from other machines."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra_agent.cli", "--db", str(tmp_path / "runs.db"), "review",
         "serve", "--host", "127.0.0.2", "--port", "0", "--token", TOKEN],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=stoppable,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = next(line.split()[1] for line in proc.stdout if line.startswith("open:"))
        assert url.startswith("http://127.0.0.2:")
        port = int(url.split(":")[2].split("/")[0])
        conn = socket.create_connection(("127.0.0.2", port), timeout=20)
        conn.sendall(
            f"GET /proposals?token={TOKEN} HTTP/1.1\r\nHost: evil.example\r\n\r\n".encode()
        )
        assert status(read_all(conn)) == 403
        conn.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "reachable from other machines" not in err
    assert Address.for_bind("127.0.0.2", 80).checked and Address.for_bind("::1", 80).checked
    assert not Address.for_bind("0.0.0.0", 80).checked


def test_error_text_loses_its_paths_and_keeps_the_rest() -> None:
    from infra_agent.review.web.guards import pathless

    git = "git add in /srv/data/workspaces/toy: fatal: Unable to create '/srv/data/workspaces/toy/.git/index.lock'"
    assert pathless(git) == "git add in …/toy: fatal: Unable to create '…/index.lock'"
    kept = "branch infra-agent/prop-1 at http://127.0.0.1:8765/proposals/x, page /proposals"
    assert pathless(kept) == kept


def test_an_unexpected_error_is_the_hardened_500_page(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    address, auth = Address("r-test.localhost", 8765, checked=True), ReviewerAuth({"ana": TOKEN})
    app = create_app(server_for(tmp_path / "runs.db", auth, address=address))

    def broken_view() -> None:  # a bug in some view, naming a file as errors do
        raise OSError(f"cannot read {tmp_path}/data/secret.db")

    app.add_api_route("/broken", broken_view)
    client = TestClient(app, base_url=address.origin, raise_server_exceptions=False)
    client.cookies.set("infra_agent_review", auth.start_session("ana"))
    reply = client.get("/broken")
    assert reply.status_code == 500 and 'id="refusal"' in reply.text
    assert "OSError" in reply.text and str(tmp_path) not in reply.text
    for name, value in SECURITY_HEADERS.items():
        assert reply.headers[name] == value
