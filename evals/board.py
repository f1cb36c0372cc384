"""The live table of an eval on a Ray cluster: each attempt queued, running (on which node, how
many experiments in), finished, or retried after a lost node; one line per change where no
terminal shows the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from infra_agent.evals.records import AttemptRecord


class BoardRow(BaseModel):
    """One attempt as the live table shows it."""

    attempt: str
    """'<task> #k' (with the profile when there are several)."""
    state: str
    """queued | running | finished | failed | not_applicable | lost (requeued) | cancelled."""
    node: str = ""
    experiments: int = 0
    tries: int = 0


class Board(BaseModel):
    """Every attempt of the run in progress, in eval order."""

    rows: list[BoardRow] = Field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.state] = out.get(row.state, 0) + 1
        return out

    def render(self) -> Any:
        """A rich Table: the counts in its title, a row per attempt."""
        from rich.table import Table

        title = ", ".join(f"{n} {state}" for state, n in self.counts().items())
        table = Table(title=f"attempts on the cluster: {title}", title_justify="left")
        for column in ("attempt", "state", "node", "experiments", "tries"):
            table.add_column(
                column, justify="right" if column in ("experiments", "tries") else "left"
            )
        for r in self.rows:
            table.add_row(r.attempt, r.state, r.node or "-", str(r.experiments), str(r.tries))
        return table


def label(attempt: AttemptRecord) -> str:
    who = f"{attempt.profile}: " if attempt.profile else ""
    return f"{who}{Path(attempt.task).name} #{attempt.index + 1}"


def row(attempt: AttemptRecord, experiments: int = 0) -> BoardRow:
    """The attempt's row from its record (its last try says where it is)."""
    last = attempt.placements[-1] if attempt.placements else None
    state: str = attempt.status if attempt.status not in ("pending", "running") else "queued"
    if last is not None and attempt.status in ("pending", "running"):
        state = {"running": "running", "lost": "lost (requeued)", "cancelled": "cancelled"}.get(
            last.outcome, "queued"
        )
    if attempt.result is not None:
        experiments = attempt.result.experiments
    node = f"{last.node_id[:8]} {last.node}".strip() if last is not None else ""
    return BoardRow(attempt=label(attempt), state=state, node=node, experiments=experiments,
                    tries=len(attempt.placements))  # fmt: skip
