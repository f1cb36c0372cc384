"""`infra-agent export`: recorded runs as training datasets (OpenAI SFT, RL rows, ATIF records)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from pathlib import Path

import typer
from rich.console import Console

from infra_agent.cli.context import current
from infra_agent.config import Settings
from infra_agent.errors import UserError
from infra_agent.output import emit
from infra_agent.redact import Redactor
from infra_agent.store.verdict import Verdict
from infra_agent.trajectories.export import ExportFilter, export_dataset
from infra_agent.trajectories.formats import ExportFormat
from infra_agent.trajectories.rewards import parse_weights


def parse_when(text: str, option: str, *, end_of_day: bool) -> datetime:
    """ISO date or date-time; a bare date means the start (or, for --until, the end) of that UTC
    day; times without a zone are UTC."""
    try:
        if len(text) == 10:
            day = datetime.combine(datetime.fromisoformat(text).date(), time(), tzinfo=UTC)
            return day + timedelta(days=1, microseconds=-1) if end_of_day else day
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"{option} '{text}': expected an ISO date (2026-11-30) or date-time"
        ) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def configured_secrets(settings: Settings) -> list[str]:
    """Secrets held in the configuration itself: LLM API keys and review tokens."""
    profiles = [settings.llm.endpoint, *settings.llm.profiles.values()]
    keys = [p.resolved_key() for p in profiles]
    tokens = [t.get_secret_value() for t in settings.review.tokens.values()]
    return [k for k in [*keys, *tokens] if k]


def _verdict(text: str) -> Verdict:
    try:
        return Verdict(text.upper())
    except ValueError:
        known = ", ".join(v.value for v in Verdict)
        raise UserError(f"--verdict '{text}': unknown verdict (one of {known})") from None


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        format: str = typer.Option(..., "--format", "-f", help="openai-sft | rl | atif"),
        out: Path = typer.Option(..., "--out", "-o", help="Output file (replaced atomically)."),
        parquet: bool = typer.Option(False, "--parquet", help="Write Parquet instead of JSONL."),
        task: list[str] = typer.Option([], "--task", help="Only runs of this task (repeatable)."),
        run: list[str] = typer.Option([], "--run", help="Only this run id (repeatable)."),
        eval_id: str | None = typer.Option(
            None, "--eval", help="Only the runs of this eval's attempts (infra-agent eval)."
        ),
        since: str | None = typer.Option(
            None, "--since", help="Runs created on/after (ISO date or time, UTC)."
        ),
        until: str | None = typer.Option(
            None, "--until", help="Runs created on/before (ISO date or time, UTC)."
        ),
        verdict: list[str] = typer.Option(
            [], "--verdict", help="Runs with an experiment of this verdict (repeatable)."
        ),
        min_reward: float | None = typer.Option(
            None, "--min-reward", help="Runs with trajectory reward >= this."
        ),
        reviewed_only: bool = typer.Option(
            False, "--reviewed-only", help="Runs with a human review decision."
        ),
        weight: list[str] = typer.Option(
            [], "--weight", help="Reward weight NAME=NUMBER (repeatable)."
        ),
        strict_openai: bool = typer.Option(
            False, "--strict-openai", help="openai-sft: only keys OpenAI's fine-tuning API accepts."
        ),
        jobs: int = typer.Option(
            1, "--jobs", "-j", help="Worker processes that build trajectories."
        ),
        as_json: bool = typer.Option(
            False, "--json", help="Print one JSON document on stdout, nothing else."
        ),
    ) -> None:
        """Export recorded runs as training data (OpenAI SFT JSONL, RL rows, ATIF records).

        Secrets (API keys, tokens, bearer headers, values of secret environment variables) are
        redacted from every row; every row is validated before the file is written.
        """
        try:
            fmt = ExportFormat(format)
        except ValueError:
            raise UserError(f"--format '{format}': expected one of openai-sft, rl, atif") from None
        try:
            weights = parse_weights(weight)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if eval_id is not None:
            from infra_agent.evals.records import eval_run_ids

            if run:
                raise UserError("--eval selects the runs itself; drop --run")
            run = eval_run_ids(current().store_path(), eval_id)
        flt = ExportFilter(
            tasks=task,
            runs=run,
            since=parse_when(since, "--since", end_of_day=False) if since else None,
            until=parse_when(until, "--until", end_of_day=True) if until else None,
            verdicts=[_verdict(v) for v in verdict],
            min_reward=min_reward,
            reviewed_only=reviewed_only,
        )
        inv = current()
        if not inv.store_path().exists():
            raise UserError(f"no run store at {inv.store_path()}: nothing to export")
        settings = inv.settings()
        redactor = Redactor.from_environment(
            settings.sandbox.secret_env_patterns, extra=configured_secrets(settings)
        )
        summary = export_dataset(
            inv.store(readonly=True),
            fmt,
            out,
            parquet=parquet,
            flt=flt,
            redactor=redactor,
            weights=weights,
            jobs=jobs,
            strict_openai=strict_openai,
        )

        def render(console: Console) -> None:
            console.print(summary.render(), markup=False, highlight=False)

        emit(summary, render, as_json=as_json)
