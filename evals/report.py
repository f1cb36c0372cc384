"""`infra-agent eval report`: a terminal table, JSON, and a self-contained HTML report with plots.

Several evals side by side (`eval report A B`) put agents and feedback settings next to each
other: the same policy or model with dense and sparse feedback, or a model beside the search
baseline on the same budget.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from infra_agent.evals.metrics import FAST_P, Cell, EvalSummary
from infra_agent.evals.placements import nodes_html, retried_lines


def _fmt(value: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _set_aside(c: Cell) -> str:
    """'2 (1 suspicious, 1 not held)', or '-'."""
    total = sum(c.set_aside.values())
    if not total:
        return "-"
    return f"{total} (" + ", ".join(f"{n} {why}" for why, n in c.set_aside.items()) + ")"


def set_aside_lines(summary: EvalSummary) -> list[str]:
    """Each win set aside, one line: its task, ratio, reason and why in words."""
    out = []
    for a in summary.attempts:
        for w in (a.get("result") or {}).get("set_aside", []):
            ratio = f" {w['speedup']:.3f}x" if w.get("speedup") is not None else ""
            out.append(
                f"{Path(a['task']).name} attempt {a['index']}: win{ratio} ({w['experiment_id']}) "
                f"set aside, {w['why']}: {w['detail']}"
            )
    return out


def rows(summaries: list[EvalSummary]) -> list[dict[str, str]]:
    """The table both renderings show, one row per cell."""
    out = []
    for s in summaries:
        for c in s.cells:
            out.append(
                {
                    "eval": s.eval["id"],
                    "agent": c.agent,
                    "feedback": c.feedback,
                    "task": "all tasks" if c.task == "*" else Path(c.task).name,
                    "solved": (f"{c.solved}/{c.applicable}" if c.applicable else "n/a")
                    + (f" ({c.not_applicable} n/a)" if c.not_applicable and c.applicable else ""),
                    "true": f"{c.true_solved}/{c.true_solved + c.lucky}"
                    if c.true_solved + c.lucky
                    else "-",
                    "improved": f"{c.improved}/{c.applicable}" if c.applicable else "n/a",
                    "disproved": f"{c.disproved}/{c.reverified}" if c.reverified else "-",
                    "set aside": _set_aside(c),
                    "solve 95% CI": (
                        f"{c.solve_ci[0]:.2f}-{c.solve_ci[1]:.2f}" if c.applicable else "-"
                    ),
                    "best": _fmt(c.best_speedup, ".3f", "x"),
                    **{f"fast_{k}": f"{v:.2f}" for k, v in c.fast_p.items()},
                    **{f"pass@{k}": f"{v:.2f}" for k, v in c.pass_at_k.items()},
                    "turns→win": _fmt(c.first_win.get("turns"), ".0f"),
                    "exp→win": _fmt(c.first_win.get("experiments"), ".0f"),
                    "tokens→win": _fmt(c.first_win.get("tokens"), ".0f"),
                    "wall→win": _fmt(c.first_win.get("wall_s"), ".0f", " s"),
                    "invalid": str(c.invalid_calls),
                    "rejected": str(c.rejected),
                }
            )
    return out


_TERMINAL = ("task", "solved", "true", "solve 95% CI", "best", "fast_p", "pass@k", "exp→win", "tokens→win",
             "disproved", "set aside")  # fmt: skip


def render_terminal(summaries: list[EvalSummary], console: Any) -> None:
    """The decisive columns (the HTML report and --json have all of them)."""
    from rich.table import Table

    for s in summaries:
        c0 = s.eval
        table = Table(
            title=f"eval {c0['id']}: {c0['policy']}{' ' + c0['model'] if c0.get('model') else ''}, "
            f"{c0['feedback']} feedback, suite {c0['suite']}, {c0['attempts']} attempt(s)"
        )
        columns: tuple[str, ...] = (
            ("agent", *_TERMINAL) if len({c.agent for c in s.cells}) > 1 else _TERMINAL
        )
        if not any(c.first_win.get("tokens") for c in s.cells):  # no model: no tokens to count
            columns = tuple(k for k in columns if k != "tokens→win")
        for name in columns:  # a task's name reads whole; the numbers fold when they must
            table.add_column(name, overflow="fold", no_wrap=name in ("agent", "task"))
        for row, c in zip(rows([s]), s.cells, strict=True):
            fast = "/".join(f"{v:.0%}" for v in c.fast_p.values()) if c.applicable else "-"
            passes = " ".join(f"@{k} {v:.2f}" for k, v in c.pass_at_k.items()) or "-"
            solved = row["solved"] + (f" ({c.improved} improved)" if c.improved != c.solved else "")
            values = {**row, "solved": solved, "fast_p": fast, "pass@k": passes}
            table.add_row(*(values[k] for k in columns), end_section=c.task == "*")
        console.print(table)
        tools = sorted({t for c in s.cells for t in c.tools})
        console.print(
            f"fast_p at p = {', '.join(f'{p:g}' for p in FAST_P)}; true: solved at the injected "
            f"fault, or an open task's win that held when re-measured, of those judged; disproved: best wins not "
            f"IMPROVED again on fresh seeds / re-measured; set aside: wins counted neither as "
            f"solved nor in fast_p; tools offered: {', '.join(tools)}"
        )
        for line in set_aside_lines(s):
            console.print(f"  {line}", markup=False)
        for line in retried_lines(s):
            console.print(f"  {line}", markup=False)
        said: set[tuple[str, str]] = set()  # one line per task and reason, not per attempt
        for a in s.attempts:
            key = (a["task"], a["reason"])
            if a["status"] in ("not_applicable", "failed") and key not in said:
                said.add(key)
                count = sum(1 for b in s.attempts if (b["task"], b["reason"]) == key)
                console.print(f"  {a['task']} ({count} attempt(s)): {a['status']}: {a['reason']}")


def spent_rows(summaries: list[EvalSummary]) -> list[dict[str, str]]:
    """One row per eval and task, tasks together: what its attempts solved and what they spent
    (replies, experiments, tokens, wall time; medians over the attempts), the side-by-side view
    of several evals (dense and sparse feedback, a model and the search baseline)."""
    import statistics

    out = []
    for s in summaries:
        by_task: dict[str, list[dict[str, Any]]] = {}
        for a in s.attempts:
            by_task.setdefault(Path(a["task"]).name, []).append(a)
        for task, attempts in by_task.items():
            results = [a.get("result") or {} for a in attempts]

            def median(key: str, results: list[dict[str, Any]] = results) -> float | None:
                values = [r[key] for r in results if r.get(key) is not None]
                return statistics.median(values) if values else None

            best = [r["best_speedup"] for r in results if r.get("best_speedup")]
            out.append(
                {
                    "task": task,
                    "feedback": s.eval["feedback"],
                    "agent": s.eval.get("model") or s.eval["policy"],
                    "solved": f"{sum(1 for r in results if r.get('solved'))}/{len(results)}",
                    "best": _fmt(max(best) if best else None, ".3f", "x"),
                    "replies": _fmt(median("turns"), ".0f"),
                    "experiments": _fmt(median("experiments"), ".0f"),
                    "tokens": _fmt(median("tokens"), ",.0f"),
                    "wall": _fmt(median("wall_s"), ".0f", " s"),
                    "eval": s.eval["id"],
                }
            )
    out.sort(key=lambda r: (r["task"], r["feedback"], r["agent"]))
    return out


def render_side_by_side(summaries: list[EvalSummary], console: Any) -> None:
    """Several evals in one table: per task, each eval's outcome and spending."""
    from rich.table import Table

    found = spent_rows(summaries)
    table = Table(
        title=f"{len(summaries)} evals side by side (replies, experiments, tokens, wall: "
        "medians over each eval's attempts at the task)"
    )
    for name in found[0] if found else ():
        table.add_column(name, overflow="fold", no_wrap=name in ("task", "eval"))
    last = None
    for row in found:
        if last is not None and row["task"] != last:
            table.add_section()
        last = row["task"]
        table.add_row(*row.values())
    console.print(table)


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def plots(summaries: list[EvalSummary]) -> dict[str, str]:
    """Title -> a PNG data URL (embedded, so the report is one file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, dict[str, Cell]] = {}  # one per eval and agent: task -> cell
    for s in summaries:
        for c in s.cells:
            series.setdefault(f"{c.agent} · {c.feedback} ({s.eval['id']})", {})[c.task] = c
    groups = list(series)
    tasks: list[str] = []
    for s in summaries:
        tasks += [c.task for c in s.cells if c.task != "*" and c.task not in tasks]

    out: dict[str, str] = {}
    width = 0.8 / max(1, len(series))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(tasks)), 3.6))
    for i, cells in enumerate(series.values()):
        xs = [j + i * width for j in range(len(tasks))]
        ys = [cells[t].solve_rate if t in cells else 0.0 for t in tasks]
        lo = [
            y - (cells[t].solve_ci[0] if t in cells else 0) for t, y in zip(tasks, ys, strict=True)
        ]
        hi = [
            (cells[t].solve_ci[1] if t in cells else 0) - y for t, y in zip(tasks, ys, strict=True)
        ]
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=groups[i])
    labels = [Path(t).name for t in tasks]
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(tasks))], labels)
    ax.tick_params(axis="x", rotation=30)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("solve rate (95% CI)")
    ax.legend(fontsize=8)
    out["Solve rate per task (dense and sparse side by side)"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(tasks)), 3.6))
    for i, cells in enumerate(series.values()):
        for j, t in enumerate(tasks):
            values = cells[t].speedups if t in cells else []
            ax.scatter([j + i * width] * len(values), values, label=groups[i] if j == 0 else None)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    for p in FAST_P[1:]:
        ax.axhline(p, color="grey", linewidth=0.5, linestyle=":")
    ax.set_xticks(range(len(tasks)), labels)
    ax.tick_params(axis="x", rotation=30)
    ax.set_ylabel("best proven ratio per attempt")
    ax.legend(fontsize=8)
    out["Speedup distribution (each solved attempt's best IMPROVED result)"] = _png(fig)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(tasks)), 3.4))
    for key, ax in zip(("experiments", "tokens"), axes, strict=True):
        for i, cells in enumerate(series.values()):
            ys = [(cells[t].first_win.get(key) or 0.0) if t in cells else 0.0 for t in tasks]
            ax.bar([j + i * width for j in range(len(tasks))], ys, width, label=groups[i])
        ax.set_xticks(range(len(tasks)), labels)
        ax.tick_params(axis="x", rotation=30)
        ax.set_ylabel(f"median {key} to first win")
    axes[0].legend(fontsize=8)
    out["Experiments and tokens to the first win (0: never won)"] = _png(fig)
    plt.close(fig)
    return out


def render_html(summaries: list[EvalSummary]) -> str:
    """One HTML file, no external resources: the table, the tools each eval offered, plots."""
    data = rows(summaries)
    keys: list[str] = []
    for r in data:  # evals with different attempt counts have different pass@k columns
        keys += [k for k in r if k not in keys]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join(
        "<tr class='{}'>".format("suite" if r["task"] == "all tasks" else "")
        + "".join(f"<td>{html.escape(r.get(k, '-'))}</td>" for k in keys)
        + "</tr>"
        for r in data
    )
    evals = "".join(
        f"<li><b>{html.escape(s.eval['id'])}</b>: {html.escape(s.eval['policy'])}"
        f"{' ' + html.escape(s.eval['model']) if s.eval.get('model') else ''}"
        f"{' profiles ' + html.escape(', '.join(s.eval['profiles'])) if s.eval.get('profiles') else ''}, "
        f"{html.escape(s.eval['feedback'])} feedback, suite {html.escape(s.eval['suite'])}, "
        f"{s.eval['attempts']} attempt(s) per task, budget "
        f"{html.escape(str(s.eval['config'].get('budget', {})))}; tools offered: "
        f"<code>{html.escape(', '.join(sorted({t for c in s.cells for t in c.tools})))}</code></li>"
        for s in summaries
    )
    aside = "".join(f"<li>{html.escape(line)}</li>" for s in summaries for line in set_aside_lines(s))  # fmt: skip
    figures = "".join(
        f"<figure><img alt='{html.escape(title)}' src='{url}'><figcaption>{html.escape(title)}"
        "</figcaption></figure>"
        for title, url in plots(summaries).items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infra-agent eval report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.85rem; }}
th, td {{ border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: right; }}
th {{ background: #f3f3f3; }} tr.suite td {{ font-weight: bold; background: #fafafa; }}
td:nth-child(-n+4) {{ text-align: left; }}
figure {{ margin: 1.5rem 0; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>infra-agent eval report</h1>
<ul>{evals}</ul>
<p>solved: the task's own success criterion met (a correct, IMPROVED patch with every target
and constraint the task declares shown met); improved: any IMPROVED patch; fast_p: the share of
attempts whose best proven ratio exceeds p; pass@k: unbiased estimate over the attempts;
→win: medians to the first IMPROVED experiment; disproved: best wins that were not IMPROVED
again when re-measured on fresh seeds, of those re-measured; set aside: wins counted neither as
solved nor in fast_p (flagged suspicious: a person decides; not held: not IMPROVED again when
re-measured).</p>
<table id="metrics"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
{f"<h2>Wins set aside</h2><ul id='set-aside'>{aside}</ul>" if aside else ""}
{nodes_html(summaries)}
{figures}
</body></html>
"""
