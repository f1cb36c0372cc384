"""The `infra-agent` command line. Each command group lives beside the code it drives
(`feedback/cli.py`, `tasks/cli.py`, ...); this module only assembles them and handles errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from infra_agent import __version__
from infra_agent.context import Invocation, reset
from infra_agent.errors import UserError

app = typer.Typer(
    name="infra-agent",
    help="An LLM agent that optimizes LLM serving systems; every change is proven by experiment.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"infra-agent {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    config: Annotated[
        Path | None, typer.Option("--config", help="Config file (default: ./infra-agent.toml).")
    ] = None,
    db: Annotated[Path | None, typer.Option("--db", help="Run store SQLite file.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """infra-agent: measure, hypothesize, patch, verify by experiment, hand risky wins to a human."""
    reset(
        Invocation(
            config_path=config,
            overrides={"store.db": db},
            debug=debug,
            resume_run=_resume_after_review,
        )
    )


def _resume_after_review(store_path: Path, run_id: str) -> None:
    """The review queue resumes a waiting agent run through this (wired here: review does not
    import the agent)."""
    from infra_agent.agent.runner import resume_after_review

    resume_after_review(store_path, run_id)


def _register() -> None:
    # Imported here so that a broken group shows up as an error in that group only in tests,
    # and `infra-agent --help` stays fast (groups import their heavy dependencies lazily).
    from infra_agent.agent.cli import register as register_agent
    from infra_agent.agent.model.cli import register as register_profiles
    from infra_agent.evals.cli import app as eval_app
    from infra_agent.experiments.cli import register as register_experiments
    from infra_agent.experiments.cli import register_check
    from infra_agent.feedback.cli import app as feedback_app
    from infra_agent.review.cli import app as review_app
    from infra_agent.store.cli import config_app, runs_app
    from infra_agent.tasks.cli import register as register_tasks
    from infra_agent.tasks.cli import tasks_app
    from infra_agent.tools.cli import register as register_tools
    from infra_agent.tools.cli import register_feedback as register_tool_feedback
    from infra_agent.trajectories.cli import register as register_export

    register_agent(app)  # optimize
    register_experiments(app)  # experiment, diagnose
    register_tasks(app)  # tasks
    register_check(tasks_app)  # tasks check (runs experiments)
    register_tool_feedback(feedback_app)  # feedback run (the agent's instruments on a task)
    app.add_typer(feedback_app, name="feedback")
    app.add_typer(runs_app, name="runs")
    app.add_typer(review_app, name="review")
    register_profiles(config_app)  # config profiles
    app.add_typer(config_app, name="config")
    app.add_typer(eval_app, name="eval")
    register_export(app)  # export
    register_tools(app)  # tools list


_register()


def main() -> None:
    """Entry point: run the CLI, turning UserError into a one-line message and a non-zero exit."""
    debug = "--debug" in sys.argv
    try:
        # Without standalone mode, typer returns an exit code (130 after Ctrl-C) instead of exiting.
        rc = app(standalone_mode=False)
        if isinstance(rc, int) and rc != 0:
            if rc == 130:
                typer.echo("interrupted", err=True)
            sys.exit(rc)
    except UserError as exc:
        if debug:
            raise
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        # Usage errors (unknown option, missing argument) come from click, or typer's copy of it.
        if hasattr(exc, "show") and isinstance(getattr(exc, "exit_code", None), int):
            exc.show()
            sys.exit(exc.exit_code)
        if debug:
            raise
        typer.echo(
            f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
