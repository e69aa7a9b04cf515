"""Charts as inline SVG: no script, no external font or stylesheet, readable offline and in
any browser. Every bar carries its number as text, so the figures are in the page itself (and
in its DOM), not only in the bars' lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

PALETTE = ("#3b6ea5", "#e08a2c", "#5a9e6f", "#b5485d", "#7d6ab0")
Number = int | float
Format = Callable[[Number], str]


def plain(value: Number) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def duration(seconds: Number) -> str:
    """``120 ms``, ``4.2 s``, ``42 s``, ``3.5 min``, ``2.1 h``, ``1.2 d``."""
    s = float(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 10:
        return f"{s:.1f} s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 172_800:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def _text(x: float, y: float, body: str, *, anchor: str = "start", size: int = 12, weight: str = "normal") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" font-weight="{weight}" '
        f'font-family="sans-serif" fill="#222">{escape(body)}</text>'
    )


def bar_chart(
    title: str,
    rows: Sequence[tuple[str, Sequence[Number]]],
    *,
    series: Sequence[str] = (),
    fmt: Format = plain,
    width: int = 640,
) -> str:
    """Horizontal bars, one group per row and one bar per series (a legend when there are two or more)."""
    n_series = max((len(values) for _, values in rows), default=1) or 1
    label_w, bar_h, gap, top = 170, 16, 10, 30 + (18 if len(series) > 1 else 0)
    value_w = 90
    scale_w = width - label_w - value_w
    peak = max((float(v) for _, values in rows for v in values), default=0.0) or 1.0
    group_h = n_series * bar_h + gap
    height = top + max(len(rows), 1) * group_h + 10
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" class="chart"><title>{escape(title)}</title>',
        _text(0, 18, title, size=14, weight="bold"),
    ]
    if len(series) > 1:
        for i, name in enumerate(series):
            x = label_w + i * 120
            parts.append(f'<rect x="{x}" y="28" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
            parts.append(_text(x + 14, 37, name, size=11))
    if not rows:
        parts.append(_text(label_w, top + 12, "nothing to show", size=12))
    for r, (label, values) in enumerate(rows):
        y0 = top + r * group_h
        parts.append(_text(label_w - 6, y0 + n_series * bar_h / 2 + 4, label, anchor="end"))
        for i, value in enumerate(values):
            y = y0 + i * bar_h
            w = max(float(value) / peak * scale_w, 1.0 if float(value) > 0 else 0.0)
            parts.append(
                f'<rect x="{label_w}" y="{y:.1f}" width="{w:.1f}" height="{bar_h - 2}" '
                f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(label)}: {escape(fmt(value))}</title></rect>'
            )
            parts.append(_text(label_w + w + 4, y + bar_h - 5, fmt(value), size=11))
    parts.append("</svg>")
    return "".join(parts)


def column_chart(
    title: str,
    columns: Sequence[tuple[str, Number]],
    *,
    x_label: str = "",
    fmt: Format = plain,
    width: int = 640,
    height: int = 220,
) -> str:
    """Vertical bars (a histogram): one column per bucket, its count above it."""
    top, bottom, left = 30, 36, 10
    plot_h = height - top - bottom
    n = max(len(columns), 1)
    slot = (width - 2 * left) / n
    peak = max((float(v) for _, v in columns), default=0.0) or 1.0
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" class="chart"><title>{escape(title)}</title>',
        _text(0, 18, title, size=14, weight="bold"),
    ]
    if not columns:
        parts.append(_text(left, top + 20, "nothing to show"))
    for i, (label, value) in enumerate(columns):
        h = float(value) / peak * (plot_h - 14)
        x = left + i * slot + slot * 0.15
        y = top + plot_h - h
        parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{h:.1f}" fill="{PALETTE[0]}">'
            f"<title>{escape(label)}: {escape(fmt(value))}</title></rect>"
        )
        parts.append(_text(x + slot * 0.35, y - 3, fmt(value), anchor="middle", size=11))
        parts.append(_text(x + slot * 0.35, top + plot_h + 14, label, anchor="middle", size=11))
    if x_label:
        parts.append(_text(width / 2, height - 4, x_label, anchor="middle", size=11))
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    title: str,
    points: Sequence[str],
    series: Sequence[tuple[str, Sequence[Number]]],
    *,
    fmt: Format = plain,
    width: int = 720,
    height: int = 240,
) -> str:
    """One line per series over the same points (runs, oldest first), each point's value in
    its ``<title>`` and the last value written at the line's end."""
    top, bottom, left, right = 48, 30, 10, 110
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max((float(v) for _, values in series for v in values), default=0.0) or 1.0
    step = plot_w / max(len(points) - 1, 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" class="chart"><title>{escape(title)}</title>',
        _text(0, 18, title, size=14, weight="bold"),
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#999"/>',
    ]
    for i, (name, _) in enumerate(series):
        key_x = left + i * 130
        parts.append(f'<rect x="{key_x}" y="28" width="10" height="10" fill="{PALETTE[i % len(PALETTE)]}"/>')
        parts.append(_text(key_x + 14, 37, name, size=11))
    if not points:
        parts.append(_text(left, top + 20, "nothing to show"))
    for i, (name, values) in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        xy = [(left + j * step, top + plot_h - float(v) / peak * plot_h) for j, v in enumerate(values)]
        if len(xy) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for (x, y), label, v in zip(xy, points, values, strict=False):
            parts.append(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}">'
                f"<title>{escape(label)} {escape(name)}: {escape(fmt(v))}</title></circle>"
            )
        if xy:
            parts.append(_text(xy[-1][0] + 6, xy[-1][1] + 4, f"{name} {fmt(values[-1])}", size=11))
    if points:
        parts.append(_text(left, height - 8, points[0], size=10))
        parts.append(_text(left + plot_w, height - 8, points[-1], anchor="end", size=10))
    parts.append("</svg>")
    return "".join(parts)
