"""The gate every request passes, as ASGI middleware around the app: checks first, reads later.

From the request head alone, before one byte of a body is read: its size and framing, Host and
Origin, the token login, and the session (every page but the static assets needs one). Only
then does the app see the request, and it reads at most the body's announced length (never
over MAX_BODY_BYTES), counted here whatever the headers said. A refusal closes the connection;
what has arrived of a small body it refused before the app saw it (a form: at most DRAIN_BYTES
announced, read for at most DRAIN_S) is dropped first, since closing a socket with unread data
resets the connection and the client may lose the refusal (a suite run saw "connection reset"
for a 403); a refusal never waits longer for a body, and a larger one is not read at all. Every response leaves with the security
headers, a 500 included; an error the app did not handle becomes the short refusal page (its
type only: the message, which may name files, goes to the server's log).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infra_agent.review.web.auth import SESSION_COOKIE, ReviewerAuth, Session
from infra_agent.review.web.guards import (
    MAX_BODY_BYTES,
    Address,
    Refused,
    check_head,
    check_host_and_origin,
)

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # own posts carry their Origin; nothing leaks out
    "Cache-Control": "no-store",
}
DRAIN_BYTES = 64 * 1024
"""The largest announced body a gate refusal reads (and drops) before it answers."""
DRAIN_S = 0.5
"""The longest a gate refusal waits for such a body's bytes."""
PUBLIC_PREFIXES = ("/static/", "/assets/")
"""Paths served without a session: the stylesheets and script a refusal page loads."""
log = logging.getLogger("infra_agent.review")

Render = Callable[[Request, int, str], Response]
"""Renders the refusal page: (request, status, message) -> response."""
Login = Callable[[Request, str], Response]
"""Exchanges a login token (already checked: Host, Origin) for a session cookie."""


def session_of(request: Request) -> Session:
    """The session the gate found for this request."""
    session = request.scope.get("state", {}).get("session")
    if not isinstance(session, Session):
        raise RuntimeError(f"{request.url.path} is served without a session")
    return session


class Gate:
    """ASGI middleware doing the module docstring's checks, in that order, around the app."""

    def __init__(
        self, app: ASGIApp, *, address: Address, auth: ReviewerAuth, render: Render, login: Login
    ) -> None:
        self.app, self.address, self.auth = app, address, auth
        self.render, self.login = render, login

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def hardened(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = Headers(raw=message.setdefault("headers", []))
                for key, value in SECURITY_HEADERS.items():
                    if key.lower() not in headers:
                        message["headers"].append((key.lower().encode(), value.encode()))
            await send(message)

        request = Request(scope)
        entered = False  # whether the app (which may read the body) saw the request
        try:
            allowed = self._admit(scope, request)
            if isinstance(allowed, Response):
                await allowed(scope, receive, hardened)
                return
            entered = True
            await self.app(scope, _bounded(receive, allowed), hardened)
        except Refused as exc:
            if started:
                raise
            if not entered:
                await _drain(receive, request.headers.get("content-length", ""))
            await self._refuse(request, exc.status, str(exc), scope, receive, hardened)
        except Exception as exc:
            if started:
                raise
            log.exception("review page %s failed", scope.get("path"))
            message = f"the page failed ({type(exc).__name__}); the server's log has the details"
            await self._refuse(request, 500, message, scope, receive, hardened)

    def _admit(self, scope: Scope, request: Request) -> Response | int:
        """The login's redirect, or the number of body bytes the app may read; Refused else."""
        headers = request.headers
        raw_target = len(scope.get("raw_path") or b"") + len(scope.get("query_string", b""))
        length = check_head(raw_target, headers)
        check_host_and_origin(headers, self.address)
        token = request.query_params.get("token")
        if token is not None and scope["method"] == "GET":
            return self.login(request, token)
        if not scope["path"].startswith(PUBLIC_PREFIXES):
            session = self.auth.session(request.cookies.get(SESSION_COOKIE))
            if session is None:
                raise Refused(
                    401,
                    "not signed in (or the session ended: signed out, idle too long or too "
                    "old): open the URL printed when the server started (it carries ?token=...)",
                )
            scope.setdefault("state", {})["session"] = session
        return length

    async def _refuse(
        self,
        request: Request,
        status: int,
        message: str,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        response = self.render(request, status, message)
        response.headers["connection"] = "close"  # an unread body is never read
        await response(scope, receive, send)


async def _drain(receive: Receive, announced: str) -> None:
    """Read and drop, for at most DRAIN_S, a body of at most DRAIN_BYTES announced and never
    read (module docstring); a longer one, or one not announced, is left unread."""
    if not announced.isdigit() or not 0 < int(announced) <= DRAIN_BYTES:
        return

    async def read() -> None:
        seen = 0
        while seen <= DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            seen += len(message.get("body", b""))

    try:
        await asyncio.wait_for(read(), DRAIN_S)
    except asyncio.TimeoutError:
        return


def _bounded(receive: Receive, allowed: int) -> Receive:
    """`receive` that refuses the request (413) once the body passes `allowed` bytes (the app's
    own error handling turns it into the refusal page)."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > min(allowed, MAX_BODY_BYTES):
                raise HTTPException(413, f"request body longer than announced ({allowed:,} bytes)")
        return message

    return bounded
