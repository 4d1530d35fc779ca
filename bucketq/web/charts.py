"""Line charts as inline SVG, drawn on the server: the dashboard needs no script and nothing from the internet."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from markupsafe import Markup, escape

from bucketq.web.history import Point

# One colour per series on every page and in every table (red is dead letters wherever it appears); reader groups,
# whose names are the user's, take theirs from a palette none of these is in.
SERIES_COLORS = {"pending": "#2563eb", "ready": "#16a34a", "dead": "#dc2626", "quarantined": "#b45309",
                 "in": "#9333ea", "out": "#0891b2"}
GROUP_COLORS = ("#4f46e5", "#db2777", "#65a30d", "#0d9488", "#ca8a04", "#64748b")
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 480, 140, 48, 18, 8


def group_colors(groups: Iterable[str]) -> dict[str, str]:
    """A colour for each reader group, by its place in name order."""
    return {group: GROUP_COLORS[i % len(GROUP_COLORS)] for i, group in enumerate(sorted(groups))}


def line_chart(series: Mapping[str, Sequence[Point]], *, colors: Mapping[str, str], now: float, span_s: float,
               unit: str = "") -> Markup:
    """One line per named series over ``[now - span_s, now]``, each in its colour (``colors`` by name); the y axis
    from 0 to the largest value; a legend of coloured swatches and names. The legend's colours are inline styles:
    the page's stylesheet sets the text colour of charts, and a style attribute is the one thing that overrides it.
    """
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
    for name, points in series.items():
        color = colors[name]
        if len(points) == 1:
            cx, cy = xy(*points[0]).split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
        elif points:
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                         f'points="{" ".join(xy(t, v) for t, v in points)}"/>')
        parts.append(f'<rect class="swatch" x="{legend_x}" y="{HEIGHT - 12}" width="9" height="9" '
                     f'style="fill:{color}"/><text class="legend" x="{legend_x + 12}" y="{HEIGHT - 4}" '
                     f'style="fill:{color}">{escape(name)}</text>')
        legend_x += 24 + 6 * len(name)
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
