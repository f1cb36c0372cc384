"""The live view of a run on stderr, and the final report's rendering."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from infra_agent.agent.state import Budget, ExperimentOutcome, Usage
from infra_agent.store.verdict import Verdict

if TYPE_CHECKING:
    from infra_agent.agent.runner import RunOutcome


def _speedup(e: ExperimentOutcome) -> str:
    if e.speedup is None:
        return "-"
    ci = (
        f" [{e.ci_low:.3f}, {e.ci_high:.3f}]"
        if e.ci_low is not None and e.ci_high is not None
        else ""
    )
    return f"{e.speedup:.3f}x{ci}"


_COLORS = {
    Verdict.IMPROVED: "green",
    Verdict.REGRESSED: "red",
    Verdict.INCORRECT: "red",
    Verdict.FAILED: "red",
    Verdict.REJECTED: "magenta",
}


def experiments_table(experiments: list[ExperimentOutcome]) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("patch")
    table.add_column("verdict")
    table.add_column("speedup [95% CI]", justify="right")
    table.add_column("time", justify="right")
    for i, e in enumerate(experiments, start=1):
        by = f" by {e.broken_constraint}" if e.broken_constraint else ""  # not by the gain
        verdict = Text(
            e.verdict.value + by + (f" ({', '.join(f.value for f in e.flags)})" if e.flags else ""),
            style=_COLORS.get(e.verdict, ""),
        )
        table.add_row(str(i), e.patch_summary[:60], verdict, _speedup(e), f"{e.duration_s:.0f}s")
    return table


class LiveView:
    """Current step, the experiments so far, and the budget used; refreshed as the run moves."""

    def __init__(self, console: Console, title: str, budget: Budget) -> None:
        self.console = console
        self.title = title
        self.budget = budget
        self.step = "starting"
        self.experiments: list[ExperimentOutcome] = []
        self.usage = Usage()
        self.live = Live(self._render(), console=console, auto_refresh=False, transient=False)

    def _render(self) -> Group:
        return Group(
            Text(self.title, style="bold"),
            Text(f"step: {self.step}"),
            experiments_table(self.experiments),
            Text(self.usage.budget_line(self.budget), style="dim"),
        )

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self.live.__enter__()
        else:  # a log file or CI: one line per event and per finished experiment
            self.console.print(self.title)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.console.is_terminal:
            self.live.__exit__(None, None, None)

    def _refresh(self) -> None:
        if self.console.is_terminal:
            self.live.update(self._render(), refresh=True)

    def event(self, text: str) -> None:
        self.step = text
        if not self.console.is_terminal:
            self.console.print(f"- {text}", highlight=False)
        self._refresh()

    def state(self, values: dict[str, Any]) -> None:
        experiments = list(values.get("experiments") or [])
        if not self.console.is_terminal:
            for i, e in enumerate(
                experiments[len(self.experiments) :], start=len(self.experiments) + 1
            ):
                self.console.print(
                    f"  experiment {i}: {e.patch_summary}: {e.verdict.value} {_speedup(e)}; "
                    f"{(values.get('usage') or self.usage).budget_line(self.budget)}",
                    highlight=False,
                    markup=False,
                )
        self.experiments = experiments
        self.usage = values.get("usage") or self.usage
        self.step = str(values.get("phase", self.step))
        self._refresh()


def render_outcome(outcome: RunOutcome, console: Console) -> None:
    """The end of `optimize`: best proven result vs baseline, the review queue, the run id."""
    console.print(
        f"[bold]run {outcome.run_id}[/bold]  task {outcome.task}  policy {outcome.policy}  status {outcome.status.value}"
    )
    console.print(outcome.policy_reason)
    if outcome.best is not None:
        b = outcome.best
        console.print(
            f"[green]best proven: {b.patch_summary}: {_speedup(b)} vs baseline (IMPROVED, "
            f"experiment {b.experiment_id})[/green]"
        )
    else:
        console.print("no configuration was proven better than baseline (no IMPROVED verdict)")
    if outcome.experiments:
        console.print(experiments_table(outcome.experiments))
    for p in outcome.proposals:
        gain = f", {p.expected_gain:.3f}x" if p.expected_gain else ""
        console.print(f"proposal {p.id}: {p.status.value} (risk {p.risk.value}{gain})")
    for pid, where in outcome.applied.items():
        console.print(f"applied {pid} -> {where}")
    if outcome.stop_reason:
        console.print(f"stopped: {outcome.stop_reason}")
    for step in outcome.next_steps:
        console.print(f"  {step}")
