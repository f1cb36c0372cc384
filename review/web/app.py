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

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException

from infra_agent.errors import StoreError, UserError
from infra_agent.review.apply import Resumer, after_decision, apply_approved
from infra_agent.review.queue import (
    MAX_COMMENT_CHARS,
    ReviewConflict,
    StaleProposal,
    decide,
    list_queue,
    read_proposals,
)
from infra_agent.review.reverify import reverify
from infra_agent.review.risk import RiskPolicy
from infra_agent.review.web.auth import SESSION_COOKIE, ReviewerAuth, Session
from infra_agent.review.web.gate import Gate, session_of
from infra_agent.review.web.guards import (
    Address,
    Refused,
    check_login_source,
    pathless,
    safe_redirect,
    shown,
)
from infra_agent.review.web.listener import http_server
from infra_agent.review.web.views import diff_css, fmt, latest_result, proposal_view, raw_json
from infra_agent.store import RunStore, open_store
from infra_agent.store.records import DecisionAction, ProposalStatus, RiskLevel
from infra_agent.store.records import now as utc_now

ASSETS = Path(__file__).parents[1]
"""review/: holds templates/ and static/ (package data of infra_agent.review)."""
log = logging.getLogger("infra_agent.review")


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


def failure(exc: Exception) -> str:
    """An error's message as a page shows it: short and without filesystem paths (the server's
    log keeps it whole)."""
    log.warning("review: %s", exc)
    return shown(pathless(str(exc)), 600)


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

    def refusal(request: Request, status: int, message: str) -> HTMLResponse:
        return page(request, "refused.html", status=status, message=shown(message, 600))

    def login(request: Request, token: str) -> Response:
        """Exchange the token for a session cookie and drop it from the URL (the gate checked
        Host and Origin)."""
        check_login_source(request.headers, server.address)
        reviewer = server.auth.reviewer_for_token(token)
        if reviewer is None:
            raise Refused(401, "invalid token: open the URL printed when the server started")
        rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
        target = safe_redirect(request.url.path) + (f"?{rest}" if rest else "")
        redirect = RedirectResponse(target if target != "/" else "/proposals", status_code=303)
        redirect.set_cookie(
            SESSION_COOKIE,
            server.auth.start_session(reviewer),
            httponly=True,
            samesite="strict",
            path="/",
        )
        return redirect

    app.add_middleware(Gate, address=server.address, auth=server.auth, render=refusal, login=login)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> HTMLResponse:
        return refusal(request, exc.status, str(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> HTMLResponse:
        where = shown(request.url.path)
        message = {
            404: f"no page at {where}",
            405: f"{request.method} is not allowed on {where}",
        }.get(exc.status_code, f"{exc.status_code}: {exc.detail}")
        return refusal(request, exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> HTMLResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ())) or "request"
        return refusal(request, 400, f"bad request: {where}: {first.get('msg', 'invalid')}")

    @app.get("/")
    def index(request: Request) -> RedirectResponse:
        return RedirectResponse("/proposals", status_code=303)

    @app.get("/assets/diff.css")
    def diff_stylesheet() -> Response:
        return Response(css, media_type="text/css")

    @app.get("/proposals", response_class=HTMLResponse)
    def queue_page(
        request: Request, status: str = "pending", task: str = "", risk: str = ""
    ) -> HTMLResponse:
        session = session_of(request)
        try:
            status_filter = ProposalStatus(status) if status and status != "all" else None
            risk_filter = RiskLevel(risk) if risk else None
        except ValueError as exc:
            raise Refused(400, f"bad filter: {exc}") from None
        queue = list_queue(server.store, status=status_filter, task=task or None, risk=risk_filter)
        rows = [(p, latest_result(server.store, p)) for p in queue.proposals]
        tasks = sorted({p.task for p in read_proposals(server.store).proposals})
        return page(
            request, "queue.html", session=session, rows=rows, unreadable=queue.unreadable,
            tasks=tasks, filters={"status": status or "all", "task": task, "risk": risk},
        )  # fmt: skip

    def proposal_page(
        request: Request,
        session: Session,
        proposal_id: str,
        status: int = 200,
        error: str | None = None,
    ) -> HTMLResponse:
        try:
            proposal = server.store.get_proposal(proposal_id)
        except StoreError:
            raise Refused(
                500,
                f"proposal '{shown(proposal_id)}' cannot be read: its row in the run store does "
                "not parse (written by another version, or damaged)",
            ) from None
        if proposal is None:
            raise Refused(404, f"proposal '{shown(proposal_id)}' not found")
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
        return proposal_page(request, session_of(request), proposal_id)

    def _post(request: Request, csrf_token: str) -> Session:
        session = session_of(request)
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
            return proposal_page(request, session, proposal_id, status=409, error=failure(exc))
        except UserError as exc:
            return proposal_page(request, session, proposal_id, status=400, error=failure(exc))
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
            session.flashes.append(
                ("error", f"decision recorded, but applying failed: {failure(exc)}")
            )
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
            return proposal_page(request, session, proposal_id, status=409, error=failure(exc))
        session.flashes.append(("ok", f"applied to {done.applied_to}"))
        return RedirectResponse(f"/proposals/{proposal_id}", status_code=303)

    @app.post("/proposals/{proposal_id}/reverify", response_model=None)
    def reverify_action(request: Request, proposal_id: str, csrf_token: str = Form("")) -> Response:
        session = _post(request, csrf_token)
        proposal = server.store.get_proposal(proposal_id)
        if proposal is None:
            raise Refused(404, f"proposal '{shown(proposal_id)}' not found")
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
