"""`infra-agent review list|show|approve|reject|request-changes|reverify|apply|serve`."""

from __future__ import annotations

import getpass
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from infra_agent.cli.context import current
from infra_agent.errors import UserError
from infra_agent.output import emit, status_console
from infra_agent.review.apply import after_decision, apply_approved
from infra_agent.review.queue import decide, get_proposal, list_queue, proven_gain
from infra_agent.review.reverify import reverify
from infra_agent.review.risk import load_policy
from infra_agent.review.staleness import resolve_task, staleness
from infra_agent.store.base import RunStore
from infra_agent.store.records import (
    DecisionRecord,
    ExperimentRecord,
    PatchRecord,
    ProposalRecord,
    ProposalStatus,
    RiskLevel,
)
from infra_agent.tasks.manifest import Task

app = typer.Typer(
    help="The reviewer approval queue: list, show, approve, reject, request changes, serve the web UI.",
    no_args_is_help=True,
)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def _default_reviewer() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name (some containers)
        return "reviewer"


ReviewerOpt = Annotated[
    str | None,
    typer.Option("--reviewer", help="Your name in the audit log (default: your user name)."),
]
HashOpt = Annotated[
    str | None,
    typer.Option(
        "--patch-hash",
        help="The patch hash you reviewed (from `review show`); refused if the proposal now carries another.",
    ),
]
RepoOpt = Annotated[
    Path | None,
    typer.Option(
        "--repo",
        help="Git repository to create the branch in (default: a git copy of the task workspace).",
    ),
]
ArgsOpt = Annotated[
    Path | None,
    typer.Option(
        "--args-file", help="Deployment argument file (TOML [server_args]) for knob changes."
    ),
]


class ProposalDetail(BaseModel):
    """Everything `review show` knows about one proposal."""

    proposal: ProposalRecord
    patch: PatchRecord | None
    experiments: list[ExperimentRecord]
    decisions: list[DecisionRecord]
    stale_reason: str | None


class DecisionReport(BaseModel):
    proposal: ProposalRecord
    message: str


def _report(proposal: ProposalRecord, message: str, as_json: bool) -> None:
    emit(
        DecisionReport(proposal=proposal, message=message),
        lambda c: c.print(message, markup=False),
        as_json=as_json,
    )


def _resolve_hash(proposal: ProposalRecord, given: str | None) -> str:
    if given is None:
        return proposal.patch_hash
    if len(given) >= 8 and proposal.patch_hash.startswith(given):
        return proposal.patch_hash
    return given  # decide() refuses it with the reason


def _gain(store: RunStore, p: ProposalRecord) -> str:
    """The proven gain (the CI's low end), with the point estimate beside it."""
    proven = proven_gain(store, p)
    if proven is None:
        return "—"
    point = f" (point {p.expected_gain:.3f}x)" if p.expected_gain not in (None, proven) else ""
    return f"{proven:.3f}x{point}"


@app.command("list")
def list_proposals(
    status: Annotated[
        str,
        typer.Option(
            "--status",
            help="pending, approved, rejected, changes_requested, applied, superseded or all.",
        ),
    ] = "pending",
    task: Annotated[str | None, typer.Option("--task", help="Only this task.")] = None,
    risk: Annotated[
        str | None,
        typer.Option("--risk", help="Only this risk level (low, medium, high, forbidden)."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List proposals, largest proven gain (the low end of the speedup's CI) first."""
    try:
        status_filter = None if status == "all" else ProposalStatus(status)
        risk_filter = RiskLevel(risk) if risk else None
    except ValueError as exc:
        raise UserError(f"bad filter: {exc}") from None
    store = current().store(readonly=True)
    queue = list_queue(store, status=status_filter, task=task, risk=risk_filter)
    proposals = queue.proposals
    if queue.unreadable:
        status_console(as_json).print(
            f"unreadable (the run store cannot parse these rows): {', '.join(queue.unreadable)}",
            markup=False,
        )

    def render(console: Console) -> None:
        if not proposals:
            console.print(f"no proposals ({status})")
            return
        table = Table("proposal", "task", "proven gain", "risk", "status", "rationale")
        for p in proposals:
            table.add_row(
                p.id, p.task, _gain(store, p), p.risk.value, p.status.value, _short(p.rationale)
            )
        console.print(table)

    emit(proposals, render, as_json=as_json)


def _short(text: str, limit: int = 60) -> str:
    """`text` cut to `limit` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _task_or_none(proposal: ProposalRecord) -> Task | None:
    try:
        return resolve_task(proposal)
    except Exception:  # a broken task folder must not hide the proposal
        return None


@app.command("show")
def show(proposal_id: str, as_json: JsonOpt = False) -> None:
    """Show a proposal: patch, evidence, risk, staleness and the audit log."""
    store = current().store(readonly=True)
    proposal = get_proposal(store, proposal_id)
    experiments = [
        e for e in (store.get_experiment(i) for i in proposal.experiment_ids) if e is not None
    ]
    detail = ProposalDetail(
        proposal=proposal,
        patch=store.get_patch(proposal.patch_id),
        experiments=experiments,
        decisions=store.decisions(proposal.id),
        stale_reason=staleness(store, proposal)
        if proposal.status == ProposalStatus.PENDING
        else None,
    )

    def render(console: Console) -> None:
        p = proposal
        console.print(
            f"[bold]{p.id}[/] {p.task}  {p.status.value}  {p.risk.value} risk  proven gain {_gain(store, p)}  patch {p.patch_hash}"
        )
        if detail.stale_reason:
            console.print(f"[yellow]stale:[/] {detail.stale_reason}")
        if experiments:
            console.print(experiments[-1].result.render(), markup=False, highlight=False)
        for reason in p.risk_reasons:
            console.print(f"risk: {reason}", markup=False)
        if p.rationale:
            console.print(f"rationale: {p.rationale}", markup=False)
        if detail.patch is not None and detail.patch.diff:
            console.print(detail.patch.diff, markup=False, highlight=False)
        elif detail.patch is not None:
            from infra_agent.review.web.views import knob_rows  # the web package loads FastAPI

            for row in knob_rows(detail.patch, _task_or_none(p)):
                console.print(f"knob {row.name}: {row.baseline} -> {row.proposed}", markup=False)
        for d in detail.decisions:
            console.print(
                f"{d.created_at:%Y-%m-%d %H:%M:%S} {d.reviewer} {d.action.value} {d.patch_hash[:12]} {d.comment}",
                markup=False,
            )

    emit(detail, render, as_json=as_json)


def _decide(
    proposal_id: str,
    action: str,
    reviewer: str | None,
    patch_hash: str | None,
    comment: str,
    repo: Path | None,
    args_file: Path | None,
    apply: bool,
    as_json: bool,
) -> None:
    inv = current()
    store = inv.store()
    proposal = get_proposal(store, proposal_id)
    who = reviewer or _default_reviewer()
    decided = decide(
        store,
        proposal.id,
        reviewer=who,
        action=action,
        patch_hash=_resolve_hash(proposal, patch_hash),
        comment=comment,
    )
    message = f"{decided.id}: {decided.status.value} by {who}"
    if apply:
        status_console(as_json).print(f"{message}; carrying it out…")
        decided = after_decision(
            store, inv.store_path(), decided.id, reviewer=who, repo=repo, args_file=args_file,
            resume=inv.resume_run,
        )  # fmt: skip
        if decided.applied_to:
            message += f"; applied to {decided.applied_to}"
        if decided.resumption:
            message += f"; agent run: {decided.resumption}"
    _report(decided, message, as_json)


ApplyOpt = Annotated[
    bool,
    typer.Option(
        "--apply/--no-apply", help="Afterwards resume the waiting run or apply the approved patch."
    ),
]


@app.command("approve")
def approve(
    proposal_id: str, reviewer: ReviewerOpt = None, patch_hash: HashOpt = None,
    comment: Annotated[str, typer.Option("--comment", help="Note for the audit log and the agent.")] = "",
    repo: RepoOpt = None, args_file: ArgsOpt = None, apply: ApplyOpt = True, as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Approve a proposal (refused if its evidence is stale), then resume its run or apply it."""
    _decide(proposal_id, "approve", reviewer, patch_hash, comment, repo, args_file, apply, as_json)


@app.command("reject")
def reject(
    proposal_id: str, reviewer: ReviewerOpt = None, patch_hash: HashOpt = None,
    comment: Annotated[str, typer.Option("--comment", help="Why, for the audit log and the agent.")] = "",
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Reject a proposal. A run waiting for this review resumes and ends (nothing is applied);
    the decision and comment go into its run log (`runs show`), not to the model: use
    request-changes to send the agent back to work."""
    _decide(proposal_id, "reject", reviewer, patch_hash, comment, None, None, True, as_json)


@app.command("request-changes")
def request_changes(
    proposal_id: str,
    comment: Annotated[str, typer.Option("--comment", help="What the agent should change (required).")],
    reviewer: ReviewerOpt = None, patch_hash: HashOpt = None, as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Send a proposal back to the agent: the waiting run resumes, the model reads the comment
    as a message and gets 2 more experiments and 10 more replies (at most max_revisions times a
    run, 1 by default; beyond that the run ends and the request is only logged)."""
    _decide(
        proposal_id, "request_changes", reviewer, patch_hash, comment, None, None, True, as_json
    )


@app.command("reverify")
def reverify_cmd(
    proposal_id: str, reviewer: ReviewerOpt = None,
    sandbox: Annotated[str | None, typer.Option("--sandbox", help="local or docker (default: configured).")] = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Re-run the proposal's experiment against the current target and attach the new evidence."""
    inv = current()
    settings = inv.settings()
    done = reverify(
        inv.store(), proposal_id, reviewer=reviewer or _default_reviewer(),
        sandbox=sandbox or settings.sandbox.backend, policy=load_policy(settings.review.policy),
    )  # fmt: skip
    message = f"{done.id}: new evidence from {done.experiment_ids[-1]}; risk {done.risk.value}"
    _report(done, message, as_json)


@app.command("apply")
def apply_cmd(
    proposal_id: str, reviewer: ReviewerOpt = None, repo: RepoOpt = None,
    args_file: ArgsOpt = None, as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Apply an approved proposal's patch (git branch infra-agent/<id>, or the argument file)."""
    who = reviewer or _default_reviewer()
    done = apply_approved(
        current().store(), proposal_id, reviewer=who, repo=repo, args_file=args_file
    )
    _report(done, f"{done.id}: applied to {done.applied_to}", as_json)


@app.command("serve")
def serve_cmd(
    host: Annotated[
        str | None, typer.Option("--host", help="Bind address (default 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option("--port", help="Port (0: a free one).")] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="Login token instead of a generated one.",
            envvar="INFRA_AGENT_REVIEW_TOKEN",
        ),
    ] = None,
    reviewer: ReviewerOpt = None,
    repo: RepoOpt = None,
    args_file: ArgsOpt = None,
) -> None:
    """Serve the review web UI; prints the login URL (with its token) and runs until Ctrl-C."""
    from infra_agent.review.web import Address, ReviewerAuth, bind, serve, server_for

    inv = current()
    settings = inv.settings()
    host = host or settings.review.host
    port = settings.review.port if port is None else port
    tokens: dict[str, Any] = {
        name: secret.get_secret_value() for name, secret in settings.review.tokens.items()
    }
    idle_s = settings.review.session_idle_minutes * 60
    max_s = settings.review.session_max_hours * 3600
    try:
        if token is not None:
            tokens[reviewer or _default_reviewer()] = token
        if tokens:
            auth = ReviewerAuth(tokens, idle_timeout_s=idle_s, max_age_s=max_s)
        else:
            auth = ReviewerAuth.generated(reviewer, idle_timeout_s=idle_s, max_age_s=max_s)
    except ValueError as exc:
        raise UserError(f"review tokens: {exc}") from None
    policy = load_policy(settings.review.policy)
    inv.store()  # create the store if needed, before serving it
    sock = bind(host, port)
    address = Address.for_bind(host, sock.getsockname()[1])
    server = server_for(
        inv.store_path(),
        auth,
        address=address,
        repo=repo,
        args_file=args_file,
        policy=policy,
        sandbox=settings.sandbox.backend,
        resume=inv.resume_run,
    )
    if not address.checked:
        print(
            f"warning: listening on {host}, reachable from other machines; use tokens you trust",
            file=sys.stderr,
        )
    base = f"{address.origin}/proposals"
    print(f"infra-agent review: serving {inv.store_path()} on {base}")
    if token is not None or not tokens:
        print(f"open: {base}?token={token or next(iter(auth.tokens.values()))}")
    else:
        print(f"open: {base}?token=<your reviewer token>")
    print("press Ctrl-C to stop", flush=True)
    serve(server, sock)
