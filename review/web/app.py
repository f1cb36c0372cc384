"""The review web app: a queue page, a proposal page, and POST-only actions.

    app = create_app(store_path, auth=ReviewerAuth.generated())
    serve(app_settings, host="127.0.0.1", port=0)   # prints the login URL, blocks until Ctrl-C

Pages are server-rendered Jinja2 templates with a few lines of plain JavaScript. Every request
needs a reviewer session (started by the token URL); every POST needs the session's CSRF token;
requests whose Host or Origin is not this server are refused (DNS rebinding, cross-site posts).
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from infra_agent.errors import UserError
from infra_agent.review.apply import Resumer, after_decision, apply_approved
from infra_agent.review.queue import ReviewConflict, StaleProposal, decide, list_queue, reverify
from infra_agent.review.risk import RiskPolicy
from infra_agent.review.web.auth import SESSION_COOKIE, ReviewerAuth, Session
from infra_agent.review.web.views import diff_css, fmt, latest_result, proposal_view, raw_json
from infra_agent.store import RunStore, open_store
from infra_agent.store.records import DecisionAction, ProposalStatus, RiskLevel
from infra_agent.store.records import now as utc_now

ASSETS = Path(__file__).parents[1]
"""review/: holds templates/ and static/ (package data of infra_agent.review)."""
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Refused(Exception):
    """A request the server will not serve: rendered as a short page with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
    repo: Path | None = None
    args_file: Path | None = None
    data_dir: Path | None = None
    policy: RiskPolicy | None = None
    sandbox: str = "local"
    loopback_only: bool = True
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
                job.state, job.message = "failed", f"{type(exc).__name__}: {exc}"
            else:
                job.state, job.message = "done", str(outcome) if isinstance(outcome, str) else ""

        threading.Thread(target=run, name=f"review-{what}-{proposal_id}", daemon=True).start()


def _check_origin(request: Request, server: ReviewServer) -> None:
    host = request.headers.get("host", "")
    if server.loopback_only and urlsplit(f"//{host}").hostname not in {
        n.strip("[]") for n in LOOPBACK_NAMES
    }:
        raise Refused(403, f"host '{host}' is not this review server")
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != host:
        raise Refused(403, "cross-origin request refused")


def _session(request: Request, server: ReviewServer) -> Session:
    _check_origin(request, server)
    session = server.auth.session(request.cookies.get(SESSION_COOKIE))
    if session is None:
        raise Refused(
            401,
            "not signed in (or the session ended: signed out, idle too long or too old): open "
            "the URL printed when the server started (it carries ?token=...)",
        )
    return session


def create_app(server: ReviewServer) -> FastAPI:
    app = FastAPI(title="infra-agent review", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(ASSETS / "templates"))
    templates.env.globals.update(
        fmt=fmt, raw_json=raw_json, RiskLevel=RiskLevel, ProposalStatus=ProposalStatus
    )
    app.mount("/static", StaticFiles(directory=str(ASSETS / "static")), name="static")
    css = diff_css()

    def page(
        request: Request,
        name: str,
        status: int = 200,
        session: Session | None = None,
        **context: Any,
    ) -> HTMLResponse:
        flashes = []
        if session is not None:
            flashes, session.flashes = session.flashes, []
        return templates.TemplateResponse(
            request, name, {"session": session, "flashes": flashes, **context}, status_code=status
        )

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        for key, value in SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    @app.middleware("http")
    async def token_login(request: Request, call_next: Callable[[Request], Any]) -> Response:
        token = request.query_params.get("token")
        if token is None or request.method != "GET":
            response: Response = await call_next(request)
            return response
        try:
            _check_origin(request, server)
        except Refused as exc:
            return PlainTextResponse(str(exc), status_code=exc.status)
        reviewer = server.auth.reviewer_for_token(token)
        if reviewer is None:
            return PlainTextResponse("invalid token", status_code=401)
        rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
        target = request.url.path + (f"?{rest}" if rest else "")
        redirect = RedirectResponse(target if target != "/" else "/proposals", status_code=303)
        redirect.set_cookie(
            SESSION_COOKIE,
            server.auth.start_session(reviewer),
            httponly=True,
            samesite="strict",
            path="/",
        )
        return redirect

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> HTMLResponse:
        return page(request, "refused.html", status=exc.status, message=str(exc))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> HTMLResponse:
        # A bug in a view must still show the reviewer something useful, not a bare 500.
        return page(
            request,
            "refused.html",
            status=500,
            message=f"the page failed: {type(exc).__name__}: {exc}",
        )

    @app.get("/")
    def index(request: Request) -> RedirectResponse:
        _session(request, server)
        return RedirectResponse("/proposals", status_code=303)

    @app.get("/assets/diff.css")
    def diff_stylesheet() -> Response:
        return Response(css, media_type="text/css")

    @app.get("/proposals", response_class=HTMLResponse)
    def queue_page(
        request: Request, status: str = "pending", task: str = "", risk: str = ""
    ) -> HTMLResponse:
        session = _session(request, server)
        try:
            status_filter = ProposalStatus(status) if status and status != "all" else None
            risk_filter = RiskLevel(risk) if risk else None
        except ValueError as exc:
            raise Refused(400, f"bad filter: {exc}") from None
        proposals = list_queue(
            server.store, status=status_filter, task=task or None, risk=risk_filter
        )
        rows = [(p, latest_result(server.store, p)) for p in proposals]
        tasks = sorted({p.task for p in server.store.proposals()})
        return page(
            request, "queue.html", session=session, rows=rows, tasks=tasks,
            filters={"status": status or "all", "task": task, "risk": risk},
        )  # fmt: skip

    def proposal_page(
        request: Request,
        session: Session,
        proposal_id: str,
        status: int = 200,
        error: str | None = None,
    ) -> HTMLResponse:
        proposal = server.store.get_proposal(proposal_id)
        if proposal is None:
            raise Refused(404, f"proposal '{proposal_id}' not found")
        view = proposal_view(server.store, proposal)
        job = server.jobs.get(proposal_id)
        return page(
            request,
            "proposal.html",
            status=status,
            session=session,
            view=view,
            job=job,
            error=error,
        )

    @app.get("/proposals/{proposal_id}", response_class=HTMLResponse)
    def show(request: Request, proposal_id: str) -> HTMLResponse:
        return proposal_page(request, _session(request, server), proposal_id)

    def _post(request: Request, csrf_token: str) -> Session:
        session = _session(request, server)
        if not server.auth.csrf_ok(session, csrf_token):
            raise Refused(403, "missing or wrong CSRF token: reload the page and try again")
        return session

    @app.post("/logout", response_model=None)
    def logout(request: Request, csrf_token: str = Form("")) -> Response:
        _post(request, csrf_token)
        server.auth.end_session(request.cookies.get(SESSION_COOKIE))
        response = page(request, "signed_out.html")
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    @app.post("/proposals/{proposal_id}/decide", response_model=None)
    def decide_action(
        request: Request,
        proposal_id: str,
        action: str = Form(""),
        patch_hash: str = Form(""),
        comment: str = Form(""),
        csrf_token: str = Form(""),
    ) -> Response:
        session = _post(request, csrf_token)
        try:
            decided = decide(
                server.store,
                proposal_id,
                reviewer=session.reviewer,
                action=action,
                patch_hash=patch_hash,
                comment=comment.strip(),
            )
        except (ReviewConflict, StaleProposal) as exc:
            return proposal_page(request, session, proposal_id, status=409, error=str(exc))
        except UserError as exc:
            return proposal_page(request, session, proposal_id, status=400, error=str(exc))
        session.flashes.append(
            (
                "ok",
                f"{DecisionAction(action).value.replace('_', ' ')} recorded for patch {decided.patch_hash[:12]}",
            )
        )
        try:
            after = after_decision(
                server.store, server.store_path, proposal_id, reviewer=session.reviewer,
                repo=server.repo, args_file=server.args_file, data_dir=server.data_dir,
                run_async=lambda work: server.background(proposal_id, "resume", work),
                resume=server.resume,
            )  # fmt: skip
        except UserError as exc:
            session.flashes.append(("error", f"decision recorded, but applying failed: {exc}"))
        else:
            if after.status == ProposalStatus.APPLIED:
                session.flashes.append(("ok", f"applied to {after.applied_to}"))
        return RedirectResponse(f"/proposals/{proposal_id}", status_code=303)

    @app.post("/proposals/{proposal_id}/apply", response_model=None)
    def apply_action(request: Request, proposal_id: str, csrf_token: str = Form("")) -> Response:
        session = _post(request, csrf_token)
        try:
            done = apply_approved(
                server.store,
                proposal_id,
                reviewer=session.reviewer,
                repo=server.repo,
                args_file=server.args_file,
                data_dir=server.data_dir,
            )
        except UserError as exc:
            return proposal_page(request, session, proposal_id, status=409, error=str(exc))
        session.flashes.append(("ok", f"applied to {done.applied_to}"))
        return RedirectResponse(f"/proposals/{proposal_id}", status_code=303)

    @app.post("/proposals/{proposal_id}/reverify", response_model=None)
    def reverify_action(request: Request, proposal_id: str, csrf_token: str = Form("")) -> Response:
        session = _post(request, csrf_token)
        proposal = server.store.get_proposal(proposal_id)
        if proposal is None:
            raise Refused(404, f"proposal '{proposal_id}' not found")
        if proposal.status != ProposalStatus.PENDING:
            return proposal_page(
                request,
                session,
                proposal_id,
                status=409,
                error=f"proposal is {proposal.status.value}; only pending proposals are re-verified",
            )
        running = server.jobs.get(proposal_id)
        if running is not None and running.state == "running":
            return proposal_page(
                request,
                session,
                proposal_id,
                status=409,
                error=f"a {running.what} is already running for this proposal",
            )

        def work() -> str:
            done = reverify(
                server.store,
                proposal_id,
                reviewer=session.reviewer,
                sandbox=server.sandbox,
                policy=server.policy,
            )
            return f"new evidence from {done.experiment_ids[-1]}"

        server.background(proposal_id, "re-verification", work)
        session.flashes.append(("ok", "re-verification started"))
        return RedirectResponse(f"/proposals/{proposal_id}", status_code=303)

    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror})") from exc
    sock.listen(64)
    return sock


def serve(server: ReviewServer, sock: socket.socket, *, announce: Callable[[int], None]) -> None:
    """Run the app on `sock` until interrupted; `announce(port)` is called once it listens."""
    import uvicorn

    config = uvicorn.Config(
        create_app(server), log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=3,
    )  # fmt: skip
    uv = uvicorn.Server(config)
    announce(sock.getsockname()[1])
    sys.stdout.flush()
    uv.run(sockets=[sock])
    server.store.close()


def server_for(store_path: Path, auth: ReviewerAuth, *, host: str, **options: Any) -> ReviewServer:
    return ReviewServer(
        store=open_store(store_path), store_path=store_path, auth=auth,
        loopback_only=host in LOOPBACK_NAMES, **options,
    )  # fmt: skip
