"""`infra-agent tools list`: the tools a run offers its model, as the model sees them; and
`infra-agent feedback run NAME --task T`: one instrument run for a person exactly as the model
calls it (the same function, arguments checked against the same schema, the same text; the
`cli` package adds it to the `feedback` group)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import typer
from rich.console import Console
from rich.table import Table

from infra_agent.errors import UserError
from infra_agent.output import emit

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo

    from infra_agent.config import Settings
    from infra_agent.store import RunStore
    from infra_agent.tools.base import Tool

tools_app = typer.Typer(help="The agent's tools: what a run on a task offers its model.")


@tools_app.command("list")
def list_command(
    task_name: str | None = typer.Option(
        None, "--task", help="Only the tools a run on this task offers (default: every tool)."
    ),
    feedback: str = typer.Option(
        "dense", "--feedback", help="'dense' (every tool) or 'sparse' (no instruments)."
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the OpenAI tools array the model is sent."
    ),
) -> None:
    """List the tools a run offers: name, what it needs and the first sentence of its
    description, or with --json exactly the schemas the model sees."""
    from infra_agent.cli.context import current
    from infra_agent.tasks.registry import find_task
    from infra_agent.tools.registry import default_registry

    if feedback not in ("dense", "sparse"):
        raise UserError(f"--feedback must be 'dense' or 'sparse', got '{feedback}'")
    task = find_task(task_name, current().task_search_path()) if task_name else None
    registry = default_registry(feedback, task)
    schemas = registry.schemas()

    def render(console: Console) -> None:
        where = f"task {task.name}" if task else "any task (--task narrows to one)"
        table = Table(title=f"{len(schemas)} tools offered for {where}")
        for column in ("name", "needs", "description"):
            table.add_column(column)
        for name in registry.names():
            found = registry.get(name)
            assert found is not None
            first = found.description.split("\n")[0].split(". ")[0].rstrip(".")
            table.add_row(name, found.needs or "-", first)
        console.print(table)

    emit(schemas, render, as_json=as_json)


def run_command(
    name: str = typer.Argument(
        ..., help="The instrument (microbench, accuracy_diff, profile, gil_trace, ...)."
    ),
    values: list[str] | None = typer.Argument(
        None, help="Instrument parameters KEY=VALUE, as in its schema (`tools list --json`)."
    ),
    task_name: str = typer.Option(..., "--task", help="Task name or folder (its workspace)."),
    patch: Path | None = typer.Option(
        None,
        "--patch",
        help="Unified diff or knobs TOML, checked as propose_patch checks it; it becomes the "
        "instrument's patch_id.",
    ),
    params_json: str | None = typer.Option(
        None, "--params", help="Instrument parameters as one JSON object (KEY=VALUE overrides)."
    ),
    param: list[str] = typer.Option(
        [], "--param", help="Task scale parameter NAME=VALUE (repeat), as for optimize."
    ),
    sandbox: str | None = typer.Option(
        None, "--sandbox", help="local | docker (default: settings sandbox.backend)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the instrument's typed record."),
) -> None:
    """Run one of the agent's instruments on a task's workspace, exactly as the model calls it:
    print the text the model reads, or with --json the typed record."""
    from infra_agent.cli.context import current
    from infra_agent.cli.feedback import store_feedback
    from infra_agent.cli.options import parse_params
    from infra_agent.tasks.registry import find_task
    from infra_agent.tools.context import ToolContext
    from infra_agent.tools.registry import AGENT_TOOLS, default_registry

    instruments = {t.name: t for t in AGENT_TOOLS if t.kind == "instrument"}
    found = instruments.get(name)
    if found is None:
        raise UserError(
            f"unknown instrument '{name}'; instruments: {', '.join(sorted(instruments))}"
        )
    task = find_task(task_name, current().task_search_path())
    registry = default_registry("dense", task)  # what a run on this task offers its model
    if registry.get(name) is None:
        raise UserError(f"{name} does not work for task {task.name} (it needs: {found.needs})")
    arguments = instrument_arguments(found, values or [], params_json)
    settings = current().settings()
    with _tool_store(settings) as store:
        ctx = ToolContext(  # as the agent's runner builds it for a run on this task
            task=task,
            store=store,
            run_id="feedback-run",
            sandbox=sandbox or settings.sandbox.backend,
            params=parse_params(param),
            author="human",
        )
        try:
            if patch is not None:
                arguments["patch_id"] = _stored_patch(found, patch, arguments, ctx, settings)
            result = registry.call(name, json.dumps(arguments), ctx)
        finally:
            ctx.close()  # a serving instrument's server
    if result.error is not None:
        raise UserError(result.error)
    store_feedback(name, result.data or {}, result.content)
    emit(result.data or {}, lambda _: typer.echo(result.content), as_json=as_json)


def instrument_arguments(
    found: Tool[Any], items: list[str], params_json: str | None
) -> dict[str, Any]:
    """The JSON arguments of a call to `found` from --params and KEY=VALUE items: a value is
    JSON (numbers, lists, true) unless the parameter is text. Unknown names are a UserError."""
    fields = found.params.model_fields
    known = ", ".join(fields) or "none"
    arguments: dict[str, Any] = {}
    if params_json:
        try:
            raw = json.loads(params_json)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"--params is not valid JSON ({exc.msg} at column {exc.colno})"
            ) from exc
        if not isinstance(raw, dict):
            raise UserError(f"--params must be a JSON object, got {type(raw).__name__}")
        arguments.update(raw)
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"'{item}' is not KEY=VALUE (parameters of {found.name}: {known})")
        arguments[key] = value if _is_text(fields.get(key)) else _json_or_text(value)
    unknown = sorted(set(arguments) - set(fields))
    if unknown:
        raise UserError(f"{found.name} has no parameter '{unknown[0]}' (parameters: {known})")
    return arguments


def _is_text(field: FieldInfo | None) -> bool:
    return field is not None and (
        field.annotation is str or set(get_args(field.annotation)) == {str, type(None)}
    )


def _json_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


@contextmanager
def _tool_store(settings: Settings) -> Iterator[RunStore]:
    """The configured run store, or a throwaway one (it only holds the --patch) without one."""
    from infra_agent.cli.context import current
    from infra_agent.store import open_store

    if settings.store.db is not None:
        yield current().store()
        return
    with tempfile.TemporaryDirectory(prefix="infra-agent-feedback-") as tmp:
        store = open_store(Path(tmp) / "runs.db")
        try:
            yield store
        finally:
            store.close()


def _stored_patch(
    found: Tool[Any], path: Path, arguments: dict[str, Any], ctx: Any, settings: Settings
) -> str:
    """--patch checked and stored the way propose_patch does it; its patch_id."""
    from infra_agent.tasks.patch import load_patch
    from infra_agent.tools.patching import check_and_store

    if "patch_id" not in found.params.model_fields:
        raise UserError(f"{found.name} takes no patch")
    if "patch_id" in arguments:
        raise UserError("give --patch or patch_id=, not both")
    patch = load_patch(path, max_bytes=settings.sandbox.max_patch_bytes, author="human")
    check_and_store(patch, ctx)
    return patch.hash
