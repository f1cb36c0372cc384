"""The review server's HTTP layer: uvicorn on its h11 protocol, with deadlines for slow clients.

uvicorn times out a keep-alive connection that sends nothing after a response
(`timeout_keep_alive`), but it waits forever for a connection that never finishes a request:
one opened and left idle, a head sent a byte at a time, a body that stops half-way. Here each
request must arrive whole, head and body, within `REQUEST_TIMEOUT_S` of the moment the server
waits for it (the connection opened, or the previous response went out); a client that is
slower is disconnected. The time the app takes to answer is not limited.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from infra_agent.errors import UserError
from infra_agent.review.web.guards import MAX_HEAD_BYTES

REQUEST_TIMEOUT_S = 15.0
"""How long a client may take to send a whole request (seconds)."""
KEEP_ALIVE_S = 5
"""How long an idle keep-alive connection stays open after a response (seconds)."""
_WAITING = (h11.IDLE, h11.SEND_BODY)
"""The client's h11 states while its request is still arriving."""


class DeadlineH11(H11Protocol):
    """uvicorn's h11 protocol, with a deadline on receiving each request (module docstring)."""

    request_timeout_s = REQUEST_TIMEOUT_S
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_request()

    def handle_events(self) -> None:
        super().handle_events()
        if self._deadline is not None and self.conn.their_state not in _WAITING:
            self._deadline.cancel()  # the request is in: answering it is not limited
            self._deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_request()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _await_request(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if not self.transport.is_closing() and self.conn.their_state in _WAITING:
            self._deadline = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state in _WAITING and not self.transport.is_closing():
            self.transport.close()


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror})") from exc
    sock.listen(64)
    return sock


def http_server(app: Any, *, request_timeout_s: float = REQUEST_TIMEOUT_S) -> uvicorn.Server:
    """A uvicorn server for `app` (run it with `.run(sockets=[sock])`; stop it by setting
    `.should_exit`)."""
    protocol = type("DeadlineH11", (DeadlineH11,), {"request_timeout_s": request_timeout_s})
    config = uvicorn.Config(
        app, http=protocol, ws="none", log_level="warning", access_log=False, lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=3,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
    )  # fmt: skip
    return uvicorn.Server(config)
