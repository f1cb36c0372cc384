"""The review app's routes: pages that read the queue, and POST-only actions that change it.

Each handler answers through `Pages` (review/web/app.py): a template page, a refusal, or a
proposal's page with an error; every action checks the session's CSRF token first
(`Pages.posted`), after the gate checked Host, Origin, size and session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from infra_agent.errors import UserError
from infra_agent.review.apply import after_decision, apply_approved
from infra_agent.review.queue import (
    ReviewConflict,
    StaleProposal,
    decide,
    list_queue,
    read_proposals,
)
from infra_agent.review.reverify import reverify
from infra_agent.review.web.auth import SESSION_COOKIE
from infra_agent.review.web.gate import session_of
from infra_agent.review.web.guards import Refused, failure, shown
from infra_agent.review.web.views import diff_css, latest_result
from infra_agent.store.records import DecisionAction, ProposalStatus, RiskLevel

if TYPE_CHECKING:
    from infra_agent.review.web.app import Pages


def reading(pages: Pages) -> APIRouter:
    """The pages: the queue (filtered) and one proposal."""
    router = APIRouter()
    server, css = pages.server, diff_css()

    @router.get("/")
    def index(request: Request) -> RedirectResponse:
        return RedirectResponse("/proposals", status_code=303)

    @router.get("/assets/diff.css")
    def diff_stylesheet() -> Response:
        return Response(css, media_type="text/css")

    @router.get("/proposals", response_class=HTMLResponse)
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
        return pages.page(
            request, "queue.html", session=session, rows=rows, unreadable=queue.unreadable,
            tasks=tasks, filters={"status": status or "all", "task": task, "risk": risk},
        )  # fmt: skip

    @router.get("/proposals/{proposal_id}", response_class=HTMLResponse)
    def show(request: Request, proposal_id: str) -> HTMLResponse:
        return pages.proposal(request, session_of(request), proposal_id)

    return router


def actions(pages: Pages) -> APIRouter:
    """The other state changes: sign out, apply an approved patch, re-verify."""
    router = APIRouter()
    server = pages.server

    @router.post("/logout", response_model=None)
    def logout(request: Request, csrf_token: str = Form("")) -> Response:
        pages.posted(request, csrf_token)
        server.auth.end_session(request.cookies.get(SESSION_COOKIE))
        response = pages.page(request, "signed_out.html")
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    @router.post("/proposals/{proposal_id}/apply", response_model=None)
    def apply_action(request: Request, proposal_id: str, csrf_token: str = Form("")) -> Response:
        session = pages.posted(request, csrf_token)
        try:
            done = apply_approved(
                server.store, proposal_id, reviewer=session.reviewer, repo=server.repo,
                args_file=server.args_file, data_dir=server.data_dir,
            )  # fmt: skip
        except UserError as exc:
            return pages.proposal(request, session, proposal_id, status=409, error=failure(exc))
        session.flashes.append(("ok", f"applied to {done.applied_to}"))
        return RedirectResponse(f"/proposals/{proposal_id}", status_code=303)

    @router.post("/proposals/{proposal_id}/reverify", response_model=None)
    def reverify_action(request: Request, proposal_id: str, csrf_token: str = Form("")) -> Response:
        session = pages.posted(request, csrf_token)
        proposal = server.store.get_proposal(proposal_id)
        if proposal is None:
            raise Refused(404, f"proposal '{shown(proposal_id)}' not found")
        running = server.jobs.get(proposal_id)
        refusal = (
            f"proposal is {proposal.status.value}; only pending proposals are re-verified"
            if proposal.status != ProposalStatus.PENDING
            else f"a {running.what} is already running for this proposal"
            if running is not None and running.state == "running"
            else None
        )
        if refusal is not None:
            return pages.proposal(request, session, proposal_id, status=409, error=refusal)

        def work() -> str:
            done = reverify(
                server.store, proposal_id, reviewer=session.reviewer, sandbox=server.sandbox,
                policy=server.policy,
            )  # fmt: skip
            return f"new evidence from {done.experiment_ids[-1]}"

        server.background(proposal_id, "re-verification", work)
        session.flashes.append(("ok", "re-verification started"))
        return RedirectResponse(f"/proposals/{proposal_id}", status_code=303)

    return router


def decisions(pages: Pages) -> APIRouter:
    """A reviewer's decision on a proposal, and what follows it (an apply, a resumed run)."""
    router = APIRouter()
    server = pages.server

    @router.post("/proposals/{proposal_id}/decide", response_model=None)
    def decide_action(
        request: Request,
        proposal_id: str,
        action: str = Form(""),
        patch_hash: str = Form(""),
        comment: str = Form(""),
        csrf_token: str = Form(""),
    ) -> Response:
        session = pages.posted(request, csrf_token)
        try:
            decided = decide(
                server.store, proposal_id, reviewer=session.reviewer, action=action,
                patch_hash=patch_hash, comment=comment.strip(),
            )  # fmt: skip
        except (ReviewConflict, StaleProposal) as exc:
            return pages.proposal(request, session, proposal_id, status=409, error=failure(exc))
        except UserError as exc:
            return pages.proposal(request, session, proposal_id, status=400, error=failure(exc))
        what = DecisionAction(action).value.replace("_", " ")
        session.flashes.append(("ok", f"{what} recorded for patch {decided.patch_hash[:12]}"))
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

    return router
