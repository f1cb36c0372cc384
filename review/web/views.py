"""What the proposal page shows, built from the store as plain view objects.

Every section is built defensively: evidence that is missing, of an unknown shape or malformed
becomes raw JSON in the page instead of an error, so a reviewer always sees what is there.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer

from infra_agent.errors import StoreError
from infra_agent.review.staleness import resolve_task, staleness
from infra_agent.review.web.plots import growth_svg, samples_svg
from infra_agent.review.web.trajectory import StepView, step_views
from infra_agent.store.base import RunStore
from infra_agent.store.records import (
    DecisionRecord,
    ExperimentRecord,
    PatchRecord,
    ProposalRecord,
    RunRecord,
    StepRecord,
)
from infra_agent.store.verdict import CorrectnessEvidence, ExperimentResult
from infra_agent.tasks.manifest import Task, Tolerance

DIFF_FORMATTER = HtmlFormatter(cssclass="highlight", wrapcode=True)


def fmt(value: Any) -> str:
    """A number for people: 4 significant digits, scientific for tiny/huge."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—" if value is None else str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return f"{value:.3e}"
    return f"{value:.4g}"


def raw_json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, default=str, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


@dataclass
class Row:
    label: str
    baseline: str
    candidate: str
    change: str = ""


def f64_rule(corr: CorrectnessEvidence, tol: Tolerance | None) -> str | None:
    """Why the candidate's error against float64 passed, in words; None without both errors."""
    base, cand = corr.baseline_err_f64, corr.candidate_err_f64
    if base is None or cand is None:
        return None
    ratio = f"{cand / base:.3g}x baseline's error vs float64" if base else "baseline's error is 0"
    if cand <= base:
        return f"{ratio}: at least as accurate as baseline"
    if tol is None:
        return (
            f"{ratio}: worse than baseline; the task's float64 rule cannot be read (task not found)"
        )
    allowed = base * tol.f64_factor
    if cand <= allowed:
        return (
            f"{ratio}, within the allowed {tol.f64_factor:g}x (task tolerance f64_factor; limit "
            f"{fmt(allowed)})"
        )
    if cand <= tol.f64_floor:
        return (
            f"{ratio}, above the allowed {tol.f64_factor:g}x (limit {fmt(allowed)}), but below "
            f"the task's precision floor {fmt(tol.f64_floor)} (f64_floor): errors that small count "
            "as equal"
        )
    return (
        f"{ratio}: above both the allowed {tol.f64_factor:g}x ({fmt(allowed)}) and the floor "
        f"{fmt(tol.f64_floor)}: this should not have passed"
    )


@dataclass
class AccuracySection:
    name: str
    verdict: str = ""
    first_divergence: str | None = None
    probes: list[Row] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


@dataclass
class ExperimentView:
    id: str
    record: ExperimentRecord | None = None
    raw: str | None = None
    """Raw JSON when the stored record could not be read as an ExperimentRecord."""
    comparison: list[Row] = field(default_factory=list)
    samples_plot: Markup | None = None
    growth_plots: list[tuple[str, Markup]] = field(default_factory=list)
    accuracy: list[AccuracySection] = field(default_factory=list)
    health: list[tuple[str, str]] = field(default_factory=list)
    metrics: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[tuple[str, str]] = field(default_factory=list)
    """Evidence of a shape the page does not know: (name, raw JSON)."""
    f64_rule: str | None = None
    """Why the error against float64 passed (which tolerance applied), in words."""

    @property
    def result(self) -> ExperimentResult | None:
        return self.record.result if self.record else None


@dataclass
class KnobRow:
    name: str
    baseline: str
    """The value the experiment's baseline ran with (the task's default), or why unknown."""
    proposed: str


@dataclass
class ProposalView:
    proposal: ProposalRecord
    patch: PatchRecord | None
    diff_html: Markup | None
    experiments: list[ExperimentView]
    stale_reason: str | None
    decisions: list[DecisionRecord]
    run: RunRecord | None
    steps: list[StepView]
    later_steps: int
    knobs: list[KnobRow] = field(default_factory=list)

    @property
    def latest(self) -> ExperimentView | None:
        return self.experiments[-1] if self.experiments else None


def _raw_experiment(store: RunStore, experiment_id: str) -> str | None:
    conn_factory = getattr(store, "_conn", None)
    if conn_factory is None:
        return None
    try:
        row = (
            conn_factory()
            .execute("SELECT body FROM experiments WHERE id=?", (experiment_id,))
            .fetchone()
        )
    except sqlite3.Error:
        return None
    if row is None:
        return None
    try:
        return raw_json(json.loads(row[0]))
    except ValueError:
        return str(row[0])


def _comparison(record: ExperimentRecord) -> list[Row]:
    ev = record.result.evidence
    rows: list[Row] = []
    perf = ev.performance
    if perf is not None:
        rows.append(
            Row(
                f"{perf.metric} median ({perf.unit})",
                fmt(perf.baseline_median),
                fmt(perf.candidate_median),
                f"{perf.speedup:.3f}x better, 95% CI {perf.ci_low:.3f}–{perf.ci_high:.3f}",
            )
        )
        rows.append(
            Row(
                "samples per arm",
                str(len(perf.baseline_samples) or perf.n_samples),
                str(len(perf.candidate_samples) or perf.n_samples),
            )
        )
    corr = ev.correctness
    if corr is not None and (
        corr.baseline_err_f64 is not None or corr.candidate_err_f64 is not None
    ):
        ratio = ""
        if corr.baseline_err_f64 and corr.candidate_err_f64 is not None:
            ratio = f"{corr.candidate_err_f64 / corr.baseline_err_f64:.3g}x baseline's error"
        rows.append(
            Row("error vs float64", fmt(corr.baseline_err_f64), fmt(corr.candidate_err_f64), ratio)
        )
    for name, value in ev.metrics.items():
        base_name = name.replace("candidate", "baseline")
        if "candidate" in name and base_name in ev.metrics:
            rows.append(
                Row(
                    name.replace("candidate_", "").replace("_candidate", ""),
                    fmt(ev.metrics[base_name]),
                    fmt(value),
                )
            )
    return rows


def _points(value: Any) -> list[tuple[float, float]] | None:
    """(size, error) pairs from a sweep-like record: {'points': [{'size', 'max_abs'|...}]}."""
    if isinstance(value, dict) and isinstance(value.get("points"), list):
        out = []
        for p in value["points"]:
            if not isinstance(p, dict) or "size" not in p:
                return None
            err = next(
                (p[k] for k in ("max_abs", "rmse", "rel_diff", "error", "err") if k in p), None
            )
            if not isinstance(err, int | float) or not isinstance(p["size"], int | float):
                return None
            out.append((float(p["size"]), float(err)))
        return out
    if isinstance(value, dict) and value and all(_is_num(v) for v in value.values()):
        try:
            return [(float(k), float(v)) for k, v in value.items()]
        except ValueError:
            return None
    return None


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _accuracy(name: str, value: Any) -> AccuracySection | None:
    if not isinstance(value, dict) or not ({"first_divergence", "probes"} & set(value)):
        return None
    section = AccuracySection(
        name=name,
        verdict=str(value.get("verdict", "")),
        first_divergence=value.get("first_divergence"),
        reasons=[str(r) for r in value.get("reasons", []) if isinstance(r, str | int | float)],
    )
    for probe in value.get("probes", [])[:40]:
        diff = probe.get("diff", {}) if isinstance(probe, dict) else {}
        section.probes.append(
            Row(
                str(probe.get("name", "?")),
                f"rel {fmt(diff.get('rel_diff'))}",
                f"max abs {fmt(diff.get('max_abs'))}",
                str(probe.get("blame") or ""),
            )
        )
    return section


def latest_result(store: RunStore, proposal: ProposalRecord) -> ExperimentResult | None:
    """The newest experiment's result of a proposal, None if missing or unreadable."""
    if not proposal.experiment_ids:
        return None
    try:
        record = store.get_experiment(proposal.experiment_ids[-1])
    except StoreError:
        return None
    return record.result if record is not None else None


def experiment_view(
    store: RunStore, experiment_id: str, tolerance: Tolerance | None = None
) -> ExperimentView:
    try:
        record = store.get_experiment(experiment_id)
    except StoreError:
        return ExperimentView(
            id=experiment_id, raw=_raw_experiment(store, experiment_id) or "(unreadable)"
        )
    if record is None:
        return ExperimentView(id=experiment_id, raw="(missing from the run store)")
    view = ExperimentView(id=experiment_id, record=record)
    ev = record.result.evidence
    try:
        view.comparison = _comparison(record)
        perf = ev.performance
        if perf is not None and (perf.baseline_samples or perf.candidate_samples):
            svg = samples_svg(
                perf.baseline_samples, perf.candidate_samples, metric=perf.metric, unit=perf.unit
            )
            view.samples_plot = Markup(svg) if svg else None
    except Exception as exc:  # a view bug must not hide the evidence: show it raw instead
        view.unknown.append(
            (
                f"performance (not renderable: {type(exc).__name__})",
                raw_json(ev.model_dump(mode="json")),
            )
        )
    if ev.correctness is not None:
        view.f64_rule = f64_rule(ev.correctness, tolerance)
    view.health = [(k, fmt(v)) for k, v in ev.health.items()]
    view.metrics = [(k, fmt(v)) for k, v in ev.metrics.items()]
    for name, value in ev.extra.items():
        try:
            section = _accuracy(name, value)
            if section is not None:
                view.accuracy.append(section)
                continue
            points = _points(value)
            svg = growth_svg(points, y_label=name) if points else None
            if svg:
                view.growth_plots.append((name, Markup(svg)))
                continue
        except Exception:  # unknown shape: fall through to raw JSON
            pass
        view.unknown.append((name, raw_json(value)))
    return view


def knob_rows(patch: PatchRecord, task: Task | None) -> list[KnobRow]:
    """Old -> new for a knob change: the task's default (what baseline ran with) and the value
    proposed."""
    rows = []
    for name, value in patch.knobs.items():
        knob = task.manifest.knobs.get(name) if task is not None else None
        if knob is not None:
            baseline = str(knob.default)
        else:
            baseline = "(task not found)" if task is None else "(not a knob of this task)"
        rows.append(KnobRow(name=name, baseline=baseline, proposed=str(value)))
    return rows


def proposal_view(store: RunStore, proposal: ProposalRecord) -> ProposalView:
    try:
        patch = store.get_patch(proposal.patch_id)
    except StoreError:
        patch = None
    diff_html = None
    if patch is not None and patch.diff:
        diff_html = Markup(highlight(patch.diff, DiffLexer(), DIFF_FORMATTER))
    try:
        stale = staleness(store, proposal)
    except Exception as exc:  # staleness must not break the page; approval re-checks anyway
        stale = f"could not check the evidence ({type(exc).__name__}: {exc})"
    run = store.get_run(proposal.run_id) if proposal.run_id else None
    shown: list[StepRecord] = []
    later = 0
    if run is not None:
        for step in store.steps(run.id):
            if step.created_at <= proposal.created_at:
                shown.append(step)
            else:
                later += 1
    try:
        task = resolve_task(proposal)
    except Exception:  # a broken task folder must not hide the proposal
        task = None
    tolerance = task.manifest.tolerance if task is not None else None
    return ProposalView(
        proposal=proposal,
        patch=patch,
        diff_html=diff_html,
        experiments=[experiment_view(store, e, tolerance) for e in proposal.experiment_ids],
        stale_reason=stale,
        decisions=store.decisions(proposal.id),
        run=run,
        steps=step_views(shown),
        later_steps=later,
        knobs=knob_rows(patch, task) if patch is not None and patch.knobs else [],
    )


def diff_css() -> str:
    return str(DIFF_FORMATTER.get_style_defs(".highlight"))
