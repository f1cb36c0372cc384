"""`infra-agent runs list|show`: the runs recorded in the run store."""

from __future__ import annotations

import typer
from pydantic import Field
from rich.console import Console
from rich.table import Table

from infra_agent.cli.context import current
from infra_agent.errors import UserError
from infra_agent.output import emit
from infra_agent.store.records import ProposalStatus, RunRecord, StepRecord

runs_app = typer.Typer(help="Recorded runs in the run store.", no_args_is_help=True)

JSON_OPT = typer.Option(False, "--json", help="Print one JSON document on stdout, nothing else.")


def _store_or_none():  # type: ignore[no-untyped-def]
    """The run store for reading, or None when it does not exist yet (nothing recorded)."""
    inv = current()
    if not inv.store_path().exists():
        return None
    return inv.store(readonly=True)


class ListedRun(RunRecord):
    """A run as `runs list` shows it: its record and where review left its proposals."""

    review: dict[str, ProposalStatus] = Field(default_factory=dict)
    """Proposal id -> its status (pending, approved, rejected, changes_requested, applied)."""


@runs_app.command("list")
def list_runs(
    limit: int = typer.Option(50, "--limit", help="Most recent N runs."), as_json: bool = JSON_OPT
) -> None:
    """List recorded runs, newest first, with the review outcome of their proposals."""
    store = _store_or_none()
    runs = [
        ListedRun(**r.model_dump(), review={p.id: p.status for p in store.proposals(run_id=r.id)})
        for r in (store.list_runs(limit) if store is not None else [])
    ]

    def render(console: Console) -> None:
        if not runs:
            console.print("No runs recorded yet.")
            return
        table = Table("task", "objective", "policy", "status", "review", "started", "summary")
        table.add_column("run", no_wrap=True)
        for r in runs:
            review = ", ".join(s.value for s in r.review.values()) or "-"
            table.add_row(
                r.task, r.objective, r.policy, r.status.value, review,
                r.created_at.strftime("%Y-%m-%d %H:%M"), r.summary[:40], r.id,
            )  # fmt: skip
        console.print(table)

    emit(runs, render, as_json=as_json)


@runs_app.command("show")
def show_run(run_id: str = typer.Argument(..., help="Run id."), as_json: bool = JSON_OPT) -> None:
    """Show one run: its steps, experiments and proposals."""
    store = _store_or_none()
    run = store.get_run(run_id) if store is not None else None
    if run is None or store is None:
        raise UserError(f"run '{run_id}' not found in {current().store_path()}")
    steps = store.steps(run_id)
    experiments = store.experiments(run_id)
    proposals = store.proposals(run_id=run_id)
    doc = {"run": run, "steps": steps, "experiments": experiments, "proposals": proposals}

    def render(console: Console) -> None:
        console.print(
            f"[bold]{run.id}[/] {run.task} ({run.objective}, {run.policy}) — {run.status.value}"
        )
        if run.summary:
            console.print(run.summary)
        if (env := run.environment) is not None:
            hw = env.hardware
            packages = ", ".join(f"{k} {v}" for k, v in env.packages.items())
            box = f"; sandbox {env.sandbox.backend}" if env.sandbox else ""
            console.print(f"ran on: {hw.cpu_count} CPUs, {hw.memory_gib} GiB, GPUs: "
                          f"{', '.join(hw.gpus) or 'none'}; Python {env.python}; {packages}{box}",
                          soft_wrap=True)  # fmt: skip
        console.print(
            f"{len(steps)} steps, {len(experiments)} experiments, {len(proposals)} proposals"
        )
        _print_model_usage(console, steps)
        table = Table("experiment", "patch", "verdict", "speedup (95% CI)")
        for e in experiments:
            perf = e.result.evidence.performance
            speed = f"{perf.speedup:.3f} ({perf.ci_low:.3f}-{perf.ci_high:.3f})" if perf else "-"
            table.add_row(e.id, e.patch_id[:12], e.result.verdict.value, speed)
        if experiments:
            console.print(table)

    emit(doc, render, as_json=as_json)


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _print_model_usage(console: Console, steps: list[StepRecord]) -> None:
    """The model's tokens and cost in total, then per reply (cached and reasoning tokens are
    '-' where the endpoint did not report them)."""
    turns = [s for s in steps if s.role == "assistant" and s.prompt_tokens is not None]
    if not turns:
        return

    def total(values: list[int | None]) -> str:
        known = [v for v in values if v is not None]
        return f"{sum(known):,}" if known else "-"

    cost = sum(s.cost_usd or 0.0 for s in turns)
    console.print(
        f"model: {len(turns)} replies, {total([s.prompt_tokens for s in turns])} prompt "
        f"({total([s.cached_prompt_tokens for s in turns])} cached), "
        f"{total([s.completion_tokens for s in turns])} completion "
        f"({total([s.reasoning_tokens for s in turns])} reasoning), ${cost:.4f}"
    )
    table = Table("step", "prompt", "cached", "completion", "reasoning", "cost (USD)")
    for s in turns:
        table.add_row(
            str(s.seq), _n(s.prompt_tokens), _n(s.cached_prompt_tokens),
            _n(s.completion_tokens), _n(s.reasoning_tokens), f"{s.cost_usd or 0.0:.4f}",
        )  # fmt: skip
    console.print(table)
