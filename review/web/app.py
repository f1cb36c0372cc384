"""The review web app: a queue page, a proposal page, and POST-only actions.

    sock = bind("127.0.0.1", 0)
    address = Address.for_bind("127.0.0.1", sock.getsockname()[1])   # r-<random>.localhost:PORT
    serve(server_for(store_path, ReviewerAuth.generated(), address=address), sock)  # until Ctrl-C

Pages are server-rendered Jinja2 templates with a few lines of plain JavaScript. Every request
passes the `gate` first: Host and Origin must be this server's (its own `r-<random>.localhost`
name on loopback), the URL and body small, and every page needs a reviewer session (started by
the token URL, opened directly), all before a body byte is read; every POST needs the session's
CSRF token. Every refusal and error is the same short HTML page, echoing nothing long and no
filesystem path, with the security headers of every other response (see `guards`, `gate`).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException

from infra_agent.errors import StoreError
from infra_agent.review.apply import Resumer
from infra_agent.review.queue import (
    MAX_COMMENT_CHARS,
)
from infra_agent.review.risk import RiskPolicy
from infra_agent.review.web.auth import SESSION_COOKIE, ReviewerAuth, Session
from infra_agent.review.web.gate import Gate, session_of
from infra_agent.review.web.guards import (
    Address,
    Refused,
    check_login_source,
    failure,
    safe_redirect,
    shown,
)
from infra_agent.review.web.listener import http_server
from infra_agent.review.web.routes import actions, decisions, reading
from infra_agent.review.web.views import fmt, proposal_view, raw_json
from infra_agent.store import RunStore, open_store
from infra_agent.store.records import ProposalStatus, RiskLevel
from infra_agent.store.records import now as utc_now

ASSETS = Path(__file__).parents[1]
"""review/: holds templates/ and static/ (package data of infra_agent.review)."""


@dataclass
class Job:
    """A background task of the server (re-verification, run resumption)."""

    what: str
    started: datetime = field(default_factory=utc_now)
    state: str = "running"
    """running | done | failed"""
    message: str = ""


@dataclass
class ReviewServer:
    """Everything a request handler needs."""

    store: RunStore
    store_path: Path
    auth: ReviewerAuth
    address: Address
    """Where it is served; the only Host it answers to (see `guards.Address`)."""
    repo: Path | None = None
    args_file: Path | None = None
    data_dir: Path | None = None
    policy: RiskPolicy | None = None
    sandbox: str = "local"
    resume: Resumer | None = None
    """Resumes an agent run waiting for review (wired in by the CLI)."""
    jobs: dict[str, Job] = field(default_factory=dict)

    def background(self, proposal_id: str, what: str, work: Callable[[], object]) -> None:
        job = Job(what=what)
        self.jobs[proposal_id] = job

        def run() -> None:
            try:
                outcome = work()
            except Exception as exc:  # reported on the page; the server keeps serving
                job.state, job.message = "failed", f"{type(exc).__name__}: {failure(exc)}"
            else:
                job.state, job.message = "done", str(outcome) if isinstance(outcome, str) else ""

        threading.Thread(target=run, name=f"review-{what}-{proposal_id}", daemon=True).start()


@dataclass
class Pages:
    """How every handler answers: a template page with the session's flashes, a refusal page,
    a proposal's page, and the check every POST passes first (session and CSRF token)."""

    server: ReviewServer
    templates: Jinja2Templates

    def page(
        self,
        request: Request,
        name: str,
        status: int = 200,
        session: Session | None = None,
        **context: Any,
    ) -> HTMLResponse:
        flashes = []
        if session is not None:
            flashes, session.flashes = session.flashes, []
        return self.templates.TemplateResponse(
            request, name, {"session": session, "flashes": flashes, **context}, status_code=status
        )

    def refusal(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.page(request, "refused.html", status=status, message=shown(message, 600))

    def proposal(
        self,
        request: Request,
        session: Session,
        proposal_id: str,
        status: int = 200,
        error: str | None = None,
    ) -> HTMLResponse:
        store = self.server.store
        try:
            proposal = store.get_proposal(proposal_id)
        except StoreError:
            raise Refused(
                500,
                f"proposal '{shown(proposal_id)}' cannot be read: its row in the run store does "
                "not parse (written by another version, or damaged)",
            ) from None
        if proposal is None:
            raise Refused(404, f"proposal '{shown(proposal_id)}' not found")
        view, job = proposal_view(store, proposal), self.server.jobs.get(proposal_id)
        return self.page(
            request, "proposal.html", status=status, session=session, view=view, job=job,
            error=error,
        )  # fmt: skip

    def posted(self, request: Request, csrf_token: str) -> Session:
        """The session of a POST whose CSRF token is the session's (else 403)."""
        session = session_of(request)
        if not self.server.auth.csrf_ok(session, csrf_token):
            raise Refused(403, "missing or wrong CSRF token: reload the page and try again")
        return session

    def login(self, request: Request, token: str) -> Response:
        """Exchange the token for a session cookie and drop it from the URL (the gate checked
        Host and Origin)."""
        auth = self.server.auth
        check_login_source(request.headers, self.server.address)
        reviewer = auth.reviewer_for_token(token)
        if reviewer is None:
            raise Refused(401, "invalid token: open the URL printed when the server started")
        rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
        target = safe_redirect(request.url.path) + (f"?{rest}" if rest else "")
        redirect = RedirectResponse(target if target != "/" else "/proposals", status_code=303)
        redirect.set_cookie(
            SESSION_COOKIE, auth.start_session(reviewer), httponly=True, samesite="strict", path="/"
        )
        return redirect


def create_app(server: ReviewServer) -> FastAPI:
    app = FastAPI(title="infra-agent review", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(ASSETS / "templates"))
    templates.env.globals.update(
        fmt=fmt,
        raw_json=raw_json,
        RiskLevel=RiskLevel,
        ProposalStatus=ProposalStatus,
        max_comment=MAX_COMMENT_CHARS,
    )
    app.mount("/static", StaticFiles(directory=str(ASSETS / "static")), name="static")
    pages = Pages(server, templates)
    app.add_middleware(
        Gate, address=server.address, auth=server.auth, render=pages.refusal, login=pages.login
    )
    errors(app, pages)
    app.include_router(reading(pages))
    app.include_router(decisions(pages))
    app.include_router(actions(pages))
    return app


def errors(app: FastAPI, pages: Pages) -> None:
    """Every error is the refusal page: short, no path, the status it deserves."""

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> HTMLResponse:
        return pages.refusal(request, exc.status, str(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> HTMLResponse:
        where = shown(request.url.path)
        message = {
            404: f"no page at {where}",
            405: f"{request.method} is not allowed on {where}",
        }.get(exc.status_code, f"{exc.status_code}: {exc.detail}")
        return pages.refusal(request, exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> HTMLResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "request"
        return pages.refusal(request, 400, f"bad request: {where}: {first.get('msg', 'invalid')}")


def serve(server: ReviewServer, sock: socket.socket) -> None:
    """Run the app on the listening `sock` until interrupted."""
    http_server(create_app(server)).run(sockets=[sock])
    server.store.close()


def server_for(
    store_path: Path, auth: ReviewerAuth, *, address: Address, **options: Any
) -> ReviewServer:
    return ReviewServer(
        store=open_store(store_path), store_path=store_path, auth=auth, address=address, **options
    )
