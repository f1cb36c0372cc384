"""Small inline SVG charts for the proposal page (no plotting library, no JavaScript).

`samples_svg` draws every timed sample of both arms in measurement order with each arm's median;
`growth_svg` draws error against problem size on log-log axes. Both return an `<svg>` string
that scales to its container (viewBox), with a <title> for screen readers and tooltips.
"""

from __future__ import annotations

import math
from html import escape

WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 68, 12, 24, 34
COLORS = {"baseline": "#4878a8", "candidate": "#d9822b"}


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:.3g}"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round tick values (steps of 1, 2, 2.5 or 5 x 10^k) covering [low, high]."""
    if not high > low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step + 1e-9) * step
    ticks = [first]
    while ticks[-1] < high - 1e-9 * step:
        ticks.append(first + len(ticks) * step)
    return [round(t, 12) for t in ticks]


def _frame(title: str, body: list[str], x_label: str, y_label: str) -> str:
    parts = [
        f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" fill="none" stroke="#ccc"/>',
        *body,
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 4}" text-anchor="middle" class="axis">{escape(x_label)}</text>',
        f'<text x="12" y="{(TOP + HEIGHT - BOTTOM) / 2}" text-anchor="middle" class="axis" transform="rotate(-90 12 {(TOP + HEIGHT - BOTTOM) / 2})">{escape(y_label)}</text>',
        "</svg>",
    ]
    return "\n".join(parts)


def samples_svg(
    baseline: list[float], candidate: list[float], *, metric: str, unit: str
) -> str | None:
    """Per-sample values of both arms against sample index; None when there is nothing to draw."""
    values = [v for v in baseline + candidate if math.isfinite(v)]
    if not values:
        return None
    # The y axis spans round ticks around the data; times and rates never go below zero.
    pad = (max(values) - min(values)) * 0.05 or abs(max(values)) * 0.05 or 1.0
    low, high = min(values) - pad, max(values) + pad
    if min(values) >= 0:
        low = max(low, 0.0)
    y_ticks = nice_ticks(low, high)
    low, high = y_ticks[0], y_ticks[-1]
    n = max(len(baseline), len(candidate), 2)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return LEFT + plot_w * (i + 0.5) / n

    def y(v: float) -> float:
        return TOP + plot_h * (1 - (v - low) / (high - low))

    body: list[str] = []
    for tick in y_ticks:
        body.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#eee"/>'
        )
        body.append(
            f'<text x="{LEFT - 4}" y="{y(tick) + 3:.1f}" text-anchor="end" class="tick y-tick">{_fmt(tick)}</text>'
        )
    x_ticks = {1, *(int(t) for t in nice_ticks(1, n, count=6) if 1 <= t <= n and t == int(t))}
    for number in sorted(x_ticks):
        body.append(
            f'<text x="{x(number - 1):.1f}" y="{HEIGHT - BOTTOM + 13}" text-anchor="middle" class="tick x-tick">{number}</text>'
        )
    for arm, series in (("baseline", baseline), ("candidate", candidate)):
        finite = sorted(v for v in series if math.isfinite(v))
        color = COLORS[arm]
        for i, v in enumerate(series):
            if math.isfinite(v):
                body.append(
                    f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.6" fill="{color}" fill-opacity="0.75"><title>{arm} #{i}: {_fmt(v)} {escape(unit)}</title></circle>'
                )
        if finite:
            median = (
                finite[len(finite) // 2]
                if len(finite) % 2
                else (finite[len(finite) // 2 - 1] + finite[len(finite) // 2]) / 2
            )
            body.append(
                f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(median):.1f}" y2="{y(median):.1f}" stroke="{color}" stroke-dasharray="5 3"/>'
            )
    legend_x = LEFT + 8
    for k, arm in enumerate(("baseline", "candidate")):
        body.append(
            f'<circle cx="{legend_x + k * 110}" cy="{TOP + 10}" r="4" fill="{COLORS[arm]}"/>'
        )
        body.append(
            f'<text x="{legend_x + 8 + k * 110}" y="{TOP + 14}" class="legend">{arm}</text>'
        )
    return _frame(
        f"{metric} per sample, both arms (dashed: medians)",
        body,
        "sample number (measurement order)",
        f"{metric} ({unit})",
    )


def growth_svg(points: list[tuple[float, float]], *, y_label: str = "error") -> str | None:
    """Error against size on log-log axes; None unless two or more positive points."""
    pts = sorted(
        (s, e) for s, e in points if s > 0 and e > 0 and math.isfinite(s) and math.isfinite(e)
    )
    if len(pts) < 2:
        return None
    lx = [math.log10(s) for s, _ in pts]
    ly = [math.log10(e) for _, e in pts]
    x_lo, x_hi = min(lx), max(lx)
    y_lo, y_hi = min(ly), max(ly)
    if y_hi - y_lo < 1e-9:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(v: float) -> float:
        return LEFT + 10 + (plot_w - 20) * (v - x_lo) / ((x_hi - x_lo) or 1)

    def y(v: float) -> float:
        return TOP + 8 + (plot_h - 16) * (1 - (v - y_lo) / (y_hi - y_lo))

    body = [
        f'<polyline fill="none" stroke="{COLORS["candidate"]}" stroke-width="2" points="'
        + " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in zip(lx, ly, strict=True))
        + '"/>'
    ]
    for (s, e), a, b in zip(pts, lx, ly, strict=True):
        body.append(
            f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3" fill="{COLORS["candidate"]}"><title>size {_fmt(s)}: {_fmt(e)}</title></circle>'
        )
        body.append(
            f'<text x="{x(a):.1f}" y="{HEIGHT - BOTTOM + 13}" text-anchor="middle" class="tick">{_fmt(s)}</text>'
        )
    for v in (y_lo, (y_lo + y_hi) / 2, y_hi):
        body.append(
            f'<text x="{LEFT - 4}" y="{y(v) + 3:.1f}" text-anchor="end" class="tick">{_fmt(10**v)}</text>'
        )
    return _frame(
        f"{y_label} against problem size (log-log)", body, "problem size (log)", f"{y_label} (log)"
    )
