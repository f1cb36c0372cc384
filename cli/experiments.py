"""`infra-agent experiment`: run one experiment (baseline vs a patch) and record its verdict;
`infra-agent diagnose`: reproduce a task's symptom and localize it."""

from __future__ import annotations

import signal
from contextlib import nullcontext
from pathlib import Path
from types import FrameType

import typer
from rich.console import Console

from infra_agent.errors import UserError


class Interrupted(UserError):
    """The experiment was stopped by Ctrl-C or a signal; its sandboxes were cleaned up."""

    exit_code = 130


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def register(app: typer.Typer) -> None:
    @app.command()
    def diagnose(
        task: str = typer.Option(..., "--task", help="Task name or folder."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
        param: list[str] = typer.Option(
            [], "--param", help="Scale parameter NAME=VALUE (repeatable)."
        ),
        sandbox: str = typer.Option("local", "--sandbox", help="Sandbox backend: local|docker."),
    ) -> None:
        """Reproduce a task's symptom and localize it with the instruments, changing no code."""
        from infra_agent.cli.context import current
        from infra_agent.cli.options import parse_params
        from infra_agent.experiments.diagnose import run_diagnosis
        from infra_agent.output import emit, status_console

        params = parse_params(param)
        status_console(as_json).print(f"diagnosing {task} (reproduce, then localize)...")
        result = run_diagnosis(
            task, params, sandbox=sandbox, search_path=current().task_search_path()
        )
        emit(result, lambda console: console.print(result.render(), markup=False), as_json=as_json)

    @app.command()
    def experiment(
        task: str | None = typer.Option(None, "--task", help="Task name or folder."),
        patch: Path | None = typer.Option(None, "--patch", help="Unified diff or knobs TOML."),
        sandbox: str | None = typer.Option(
            None, "--sandbox", help="Sandbox backend: local or docker (default: configured)."
        ),
        param: list[str] = typer.Option([], "--param", help="Task parameter NAME=VALUE (repeat)."),
        author: str = typer.Option("human", "--author", help="Who proposed the patch."),
        rationale: str = typer.Option("", "--rationale", help="Why the patch should help."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
        detect: float | None = typer.Option(
            None,
            "--detect",
            help="Smallest relative change the experiment must resolve, e.g. 0.05 for 5% "
            "(default: the task's target_ci_width). The verdict says when the budget cannot.",
        ),
        extend: str | None = typer.Option(
            None,
            "--extend",
            help="Instead of --task/--patch: an experiment id that ended NO_CHANGE underpowered "
            "or unresolved; continues it with more pairs on the same patch.",
        ),
    ) -> None:
        """Verify a patch against its task's baseline and print the verdict with its evidence."""
        from infra_agent.cli.context import current
        from infra_agent.cli.options import parse_params
        from infra_agent.experiments.extend import extendable
        from infra_agent.experiments.run import run_experiment
        from infra_agent.experiments.verdict_text import verdict_text
        from infra_agent.output import emit, err_console
        from infra_agent.tasks.patch import Patch, load_patch
        from infra_agent.tasks.registry import find_task

        if extend is not None and (patch is not None or task is not None):
            raise UserError("--extend takes the task and patch of the experiment it extends")
        if extend is None and (task is None or patch is None):
            raise UserError("give --task and --patch (or --extend EXPERIMENT_ID)")
        settings = current().settings()
        store = current().store()
        earlier = None
        if extend is not None:
            known = store.get_experiment(extend)
            earlier = extendable(store, known.run_id if known else None, extend)
            stored = store.get_patch(earlier.patch_id)
            if stored is None:
                raise UserError(f"the patch of {extend} is missing from the run store")
            task, loaded = earlier.task, Patch.from_record(stored)
        else:
            assert task is not None and patch is not None
            loaded = load_patch(
                patch, max_bytes=settings.sandbox.max_patch_bytes, author=author,
                rationale=rationale,
            )  # fmt: skip
        found = find_task(task, settings.tasks.search_path)
        params = parse_params(param)
        backend = sandbox or settings.sandbox.backend
        # SIGTERM/SIGHUP end the run through the same path as Ctrl-C: sandboxes are cleaned.
        # One this process was started ignoring stays ignored (nohup's SIGHUP).
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                signal.signal(signum, _interrupt)
        # A spinner on a terminal; elsewhere (a log, a pipe) one line per stage, and no refresh
        # thread (rich's redraws 12.5 times a second, 5% of a short experiment's CPU, unseen).
        spinner = err_console.is_terminal
        waiting = f"experiment on {found.name}: starting"
        with err_console.status(waiting) if spinner else nullcontext() as status:

            def progress(message: str) -> None:
                if status is None:
                    err_console.print(f"experiment on {found.name}: {message}", highlight=False)
                    return
                if message.startswith("calibration:"):  # what it can detect: keep it on screen
                    err_console.print(message)
                status.update(f"experiment on {found.name}: {message}")

            try:
                record = run_experiment(
                    found, loaded, sandbox=backend, params=params, store=store,
                    progress=progress, detect=detect, extend=earlier,
                    max_patch_bytes=settings.sandbox.max_patch_bytes,
                )  # fmt: skip
            except KeyboardInterrupt as exc:
                # Raised as an error (not left to typer, which turns it into a return value):
                # exit status 130, nothing recorded, sandboxes already cleaned by the cascade.
                why = str(exc) or "Ctrl-C"
                raise Interrupted(f"experiment interrupted ({why}); nothing recorded") from None

        def render(console: Console) -> None:
            # markup off: '[underpowered]' is text, not a style tag
            console.print(verdict_text(record, found.manifest), markup=False, highlight=False)
            console.print(f"[dim]recorded as {record.id} ({record.duration_s:.1f} s)[/dim]")

        emit(record.report(), render, as_json=as_json)
