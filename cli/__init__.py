"""The `infra-agent` command line: the floor every command stands on. Each command group is a
module here (`cli/feedback.py`, `cli/tasks.py`, ...) that reads the invocation's settings and
passes them down to the library as arguments; this module only assembles the groups and turns
errors into messages. Nothing outside this package imports it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from infra_agent import __version__
from infra_agent.cli.context import Invocation, reset
from infra_agent.errors import UserError

# Only importable as part of infra_agent, never as a bare top-level name that could collide.
if __name__ != "infra_agent.cli":
    raise ImportError("this folder is part of infra_agent; import it as infra_agent.cli")

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
    from infra_agent.cli.context import current

    resume_after_review(store_path, run_id, current().settings())


def _register() -> None:
    # Imported here so that a broken group shows up as an error in that group only in tests,
    # and `infra-agent --help` stays fast (groups import their heavy dependencies lazily).
    from infra_agent.cli.agent import register as register_agent
    from infra_agent.cli.config import config_app
    from infra_agent.cli.evals import app as eval_app
    from infra_agent.cli.experiments import register as register_experiments
    from infra_agent.cli.export import register as register_export
    from infra_agent.cli.feedback import app as feedback_app
    from infra_agent.cli.review import app as review_app
    from infra_agent.cli.runs import runs_app
    from infra_agent.cli.tasks import tasks_app
    from infra_agent.cli.tools import run_command, tools_app

    register_agent(app)  # optimize, skeletons
    register_experiments(app)  # experiment, diagnose
    app.add_typer(tasks_app, name="tasks")
    feedback_app.command("run")(run_command)  # the agent's instruments on a task
    app.add_typer(feedback_app, name="feedback")
    app.add_typer(runs_app, name="runs")
    app.add_typer(review_app, name="review")
    app.add_typer(config_app, name="config")
    app.add_typer(eval_app, name="eval")
    register_export(app)  # export
    app.add_typer(tools_app, name="tools")


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
        code = getattr(exc, "exit_code", None)
        if hasattr(exc, "show") and isinstance(code, int):
            exc.show()
            sys.exit(code)
        if debug:
            raise
        typer.echo(
            f"error: {type(exc).__name__}: {exc} (run with --debug for the traceback)", err=True
        )
        sys.exit(1)
