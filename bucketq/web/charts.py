"""Line charts as inline SVG, drawn on the server: the dashboard needs no script and nothing from the internet."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

from bucketq.web.history import Point

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2")
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 480, 140, 48, 18, 8


def line_chart(series: Mapping[str, Sequence[Point]], *, now: float, span_s: float, unit: str = "") -> Markup:
    """One line per named series over ``[now - span_s, now]``; the y axis from 0 to the largest value."""
    peak = max((v for points in series.values() for _, v in points), default=0.0)
    top = _nice(peak)
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP

    def xy(t: float, v: float) -> str:
        x = LEFT + plot_w * (1 - min(span_s, max(0.0, now - t)) / span_s)
        return f"{x:.1f},{TOP + plot_h * (1 - v / top):.1f}"

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img">',
             f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 4}" y2="{TOP + plot_h}" stroke="#999"/>',
             f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="#999"/>',
             f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end">{_label(top)}{escape(unit)}</text>',
             f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>',
             f'<text x="{LEFT}" y="{HEIGHT - 4}">-{_ago(span_s)}</text>',
             f'<text x="{WIDTH - 4}" y="{HEIGHT - 4}" text-anchor="end">now</text>']
    legend_x = LEFT + 70
    for (name, points), color in zip(series.items(), COLORS * 8, strict=False):
        if len(points) == 1:
            cx, cy = xy(*points[0]).split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
        elif points:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                         f'points="{" ".join(xy(t, v) for t, v in points)}"/>')
        parts.append(f'<text x="{legend_x}" y="{HEIGHT - 4}" fill="{color}">{escape(name)}</text>')
        legend_x += 12 + 7 * len(name)
    if not any(series.values()):
        parts.append(f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" text-anchor="middle">no samples yet</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _nice(peak: float) -> float:
    """A round top for the y axis at or above ``peak`` (1, 2 or 5 times a power of ten)."""
    if peak <= 0:
        return 1.0
    scale = 10 ** len(str(int(peak))) / 10 if peak >= 1 else 1.0
    for step in (1, 2, 5, 10):
        if step * scale >= peak:
            return step * scale
    return 10 * scale


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _label(value: float) -> str:
    return f"{value / 1e6:g}M" if value >= 1e6 else f"{value / 1e3:g}k" if value >= 1e4 else f"{value:g}"
