"""`infra-agent eval`: run a policy over a suite with K attempts, resume it, and report it."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

import typer

from infra_agent.errors import UserError

app = typer.Typer(
    help="Evaluate a policy over a task suite (dense or sparse feedback); attempts are records.",
    invoke_without_command=True,
)


@app.callback()
def evaluate(
    ctx: typer.Context,
    suite: list[str] = typer.Option(
        [], "--suite", help="A suite from suites.toml (seed, sglang, all) or a task (repeatable)."
    ),
    policy: str = typer.Option("search", "--policy", help="search | scripted | llm."),
    model: list[str] = typer.Option(
        [],
        "--model",
        help="An LLM profile (`config profiles`) for --policy llm; repeat to compare.",
    ),
    attempts: int = typer.Option(1, "--attempts", help="Attempts per task (pass@k)."),
    feedback: str = typer.Option("dense", "--feedback", help="dense | sparse (no instruments)."),
    budget: str = typer.Option(None, "--budget", help="Each attempt's budget, as for optimize."),
    script: Path = typer.Option(None, "--script", help="Replies for --policy scripted."),
    sandbox: str = typer.Option(None, "--sandbox", help="local | docker."),
    executor: str = typer.Option(
        None, "--executor", help="ray: each attempt a Ray task on a cluster (default: here)."
    ),
    address: str = typer.Option(
        None, "--address", help="The Ray cluster for --executor ray (default: a private Ray)."
    ),
    parallel: int = typer.Option(1, "--parallel", help="Experiments of a turn at once."),
    parallel_attempts: int = typer.Option(
        1, "--parallel-attempts", help="Attempts at once, each in its own process and CPU set."
    ),
    suites_file: Path = typer.Option(None, "--suites-file", help="Suites TOML of your own."),
    resume: str = typer.Option(None, "--resume", help="Continue eval EVAL_ID."),
    no_reverify: bool = typer.Option(
        False, "--no-reverify", help="Skip re-measuring each attempt's best win on fresh seeds."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON document."),
) -> None:
    """Run every task of the suite `--attempts` times with the policy; print the report."""
    if ctx.invoked_subcommand is not None:
        return
    from infra_agent.agent.configuration import RunConfig, resolve_policy
    from infra_agent.agent.state import Budget
    from infra_agent.cli.context import current
    from infra_agent.cli.options import parse_budget
    from infra_agent.evals.attempt import with_profile
    from infra_agent.evals.runner import create_eval, run_eval
    from infra_agent.evals.suites import resolve
    from infra_agent.output import status_console

    settings = current().settings()
    out = status_console(as_json)
    if executor not in (None, "local", "ray"):
        raise UserError(f"--executor: '{executor}' is not local or ray")
    if address and executor != "ray":
        raise UserError("--address is for --executor ray")
    if executor == "ray" and (parallel_attempts > 1 or parallel > 1):
        raise UserError("--parallel-attempts and --parallel are for local runs; on Ray the "
                        "cluster places attempts by the resources each asks for")  # fmt: skip
    if executor == "ray" and importlib.util.find_spec("ray") is None:
        raise UserError("--executor ray needs Ray: pip install 'infra-agent[ray]'")
    if resume:
        if suite or script or budget or model or no_reverify:
            raise UserError("--resume continues an eval with its own suite and settings")
        eval_id = resume
    else:
        if policy not in ("search", "scripted", "llm"):
            raise UserError(f"--policy: '{policy}' is not search, scripted or llm")
        if feedback not in ("dense", "sparse"):
            raise UserError(f"--feedback: '{feedback}' is not dense or sparse")
        if model and policy != "llm":
            raise UserError(f"--model: profiles are for --policy llm, not {policy}")
        if len(set(model)) != len(model):
            raise UserError("--model: a profile is named twice")
        chosen, reason = "", ""
        each: list[str | None] = [*model] or [None]
        for profile in each:  # each profile must reach an endpoint
            mine = with_profile(settings, profile).llm
            chosen, reason = resolve_policy(policy, mine, script)  # type: ignore[arg-type]
        if len(model) > 1:
            reason = f"llm policy: {len(model)} profiles ({', '.join(model)})"
        label, tasks = resolve(suite, suites_file, settings.tasks.search_path)
        base = RunConfig(
            task="-",
            policy=chosen,  # type: ignore[arg-type]
            policy_reason=reason,
            budget=Budget(**parse_budget(budget)),
            sandbox=sandbox or settings.sandbox.backend,
            script=str(script.resolve()) if script else None,
            executor="local" if executor == "local" else None,  # ray: the attempts, not a turn
            parallel=parallel,
            feedback=feedback,  # type: ignore[arg-type]
        )
        model_name = settings.llm.active().model if chosen == "llm" and not model else None
        record = create_eval(
            settings.store.path(),
            suite=label,
            tasks=tasks,
            base=base,
            attempts=attempts,
            model=model_name,
            profiles=model,
            reverify=not no_reverify,
        )
        eval_id = record.id
        models = f" x {len(model)} profiles" if len(model) > 1 else ""
        out.print(f"eval {eval_id}: {reason}; {len(tasks)} task(s) x {attempts} attempt(s){models}")
    try:
        if parallel_attempts < 1:
            raise UserError("--parallel-attempts: at least 1")
        if executor == "ray":
            _run_on_ray(eval_id, settings, address, out)
        else:
            run_eval(eval_id, settings, progress=out.print, parallel_attempts=parallel_attempts)
    except KeyboardInterrupt:
        ray = f" --executor ray{f' --address {address}' if address else ''}"
        on = ray if executor == "ray" else ""
        out.print(
            f"interrupted; resume with: infra-agent --db {settings.store.path()} eval --resume "
            f"{eval_id}{on}"
        )
        sys.exit(130)
    _report([eval_id], as_json=as_json, html_file=None)


def _run_on_ray(eval_id: str, settings: Any, address: str | None, out: Any) -> None:
    """The eval on Ray, with the live table of attempts where the console is a terminal."""
    from rich.live import Live

    from infra_agent.evals.board import Board
    from infra_agent.evals.runner import ClusterOptions, run_eval

    if not out.is_terminal:
        # Ray's driver prints cluster events (a node that died) on sys.stdout, which holds the
        # report's JSON with --json: they go to stderr (a terminal's Live display takes them).
        with contextlib.redirect_stdout(sys.stderr):
            run_eval(eval_id, settings, progress=out.print, cluster=ClusterOptions(address))
        return
    with Live(Board().render(), console=out, auto_refresh=False, transient=False) as live:

        def on_board(board: Board) -> None:
            live.update(board.render(), refresh=True)

        options = ClusterOptions(address, on_board)
        run_eval(eval_id, settings, progress=live.console.print, cluster=options)


def _report(eval_ids: list[str], *, as_json: bool, html_file: Path | None) -> None:
    from infra_agent.cli.context import current
    from infra_agent.evals.metrics import summarize
    from infra_agent.evals.records import EvalStore
    from infra_agent.evals.report import render_html, render_side_by_side, render_terminal
    from infra_agent.output import emit

    path = current().settings().store.path()
    if not path.exists():
        raise UserError(f"no run store at {path}")
    store = EvalStore(path, readonly=True)
    try:
        summaries = []
        for eval_id in eval_ids:
            record = store.get_eval(eval_id)
            if record is None:
                raise UserError(f"no eval '{eval_id}' in {path}")
            summaries.append(summarize(record, store.attempts(eval_id)))
    finally:
        store.close()
    if html_file is not None:
        text = render_html(summaries)
        tmp = html_file.with_name(html_file.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(html_file)

    def render(console: Any) -> None:
        render_terminal(summaries, console)
        if len(summaries) > 1:
            render_side_by_side(summaries, console)

    emit(summaries[0] if len(summaries) == 1 else summaries, render, as_json=as_json)


@app.command("report")
def report(
    eval_ids: list[str] = typer.Argument(..., help="One eval, or several side by side."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    html_file: Path = typer.Option(None, "--html", help="Write a self-contained HTML report."),
) -> None:
    """Metrics per agent x feedback x task; several evals side by side (dense vs sparse)."""
    _report(eval_ids, as_json=as_json, html_file=html_file)


@app.command("compare")
def compare(
    first: str = typer.Argument(..., help="An eval (e.g. dense feedback)."),
    second: str = typer.Argument(
        ..., help="Another (e.g. sparse feedback, or the search baseline)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    html_file: Path = typer.Option(None, "--html", help="Write a self-contained HTML report."),
) -> None:
    """Two evals side by side (the same as `eval report A B`)."""
    _report([first, second], as_json=as_json, html_file=html_file)


@app.command("list")
def list_evals(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """The evals in the run store, newest first."""
    from infra_agent.cli.context import current
    from infra_agent.evals.records import EvalStore
    from infra_agent.output import emit

    path = current().settings().store.path()
    found = []
    if path.exists():
        store = EvalStore(path, readonly=True)
        found = store.list_evals()
        store.close()

    def render(console: object) -> None:
        for e in found:
            models = f" ({', '.join(e.profiles)})" if e.profiles else ""
            console.print(  # type: ignore[attr-defined]
                f"{e.id}  {e.status:<11} {e.policy:<9}{models} {e.feedback:<6} suite {e.suite} "
                f"x{e.attempts}  {e.created_at:%Y-%m-%d %H:%M}"
            )

    emit(found, render, as_json=as_json)
