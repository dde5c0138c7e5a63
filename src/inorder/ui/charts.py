"""Small charts as inline SVG, drawn on the server (no script, no library, no assets).

Each chart is one ``<svg>`` with a ``viewBox``: it scales with the page, and the live update
replaces it with the rest of the section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

WIDTH = 480
HEIGHT = 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 52, 8, 10, 22

#: Colours of the series, in order (readable on white, distinct for common colour blindness).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#9c755f")


def _number(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2f}"


def _frame(xs: Sequence[int], top: float, unit: str, body: list[str], label: str) -> str:
    inner_h = HEIGHT - _TOP - _BOTTOM
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}">'
    ]
    for frac in (0.0, 0.5, 1.0):
        y = _TOP + inner_h * (1 - frac)
        parts.append(
            f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
            f"{_number(top * frac)}{escape(unit) if frac else ''}</text>"
        )
    parts.extend(body)
    if xs:
        base = HEIGHT - 6
        parts.append(f'<text x="{_LEFT}" y="{base}" class="tick">batch {xs[0]}</text>')
        parts.append(
            f'<text x="{WIDTH - _RIGHT}" y="{base}" class="tick" text-anchor="end">'
            f"batch {xs[-1]}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def legend(names: Sequence[str]) -> str:
    """The series' names beside their colours."""
    items = "".join(
        f'<span class="key"><i style="background:{PALETTE[i % len(PALETTE)]}"></i>'
        f"{escape(name)}</span>"
        for i, name in enumerate(names)
    )
    return f'<div class="legend">{items}</div>'


def stacked_bars(
    xs: Sequence[int], layers: Mapping[str, Sequence[float]], unit: str, label: str
) -> str:
    """One bar per x, its layers stacked in the order given."""
    if not xs:
        return '<p class="empty">no batches yet</p>'
    totals = [sum(layer[i] for layer in layers.values()) for i in range(len(xs))]
    top = max(totals) or 1.0
    inner_w = WIDTH - _LEFT - _RIGHT
    inner_h = HEIGHT - _TOP - _BOTTOM
    step = inner_w / len(xs)
    width = max(1.0, step * 0.8)
    body = []
    for i, x in enumerate(xs):
        y = float(_TOP + inner_h)
        tip = [f"batch {x}"]
        for n, (name, values) in enumerate(layers.items()):
            h = inner_h * values[i] / top
            if h <= 0:
                continue
            y -= h
            tip.append(f"{name} {values[i]:.3f}{unit}")
            body.append(
                f'<rect x="{_LEFT + i * step + (step - width) / 2:.1f}" y="{y:.1f}" '
                f'width="{width:.1f}" height="{h:.1f}" fill="{PALETTE[n % len(PALETTE)]}"/>'
            )
        body.append(
            f'<rect x="{_LEFT + i * step:.1f}" y="{_TOP}" width="{step:.1f}" '
            f'height="{inner_h}" class="hover"><title>{escape(", ".join(tip))}</title></rect>'
        )
    return legend(list(layers)) + _frame(xs, top, unit, body, label)


def lines(
    xs: Sequence[int], series: Mapping[str, Sequence[float | None]], unit: str, label: str
) -> str:
    """One line per series over x (gaps where a value is unknown)."""
    if not xs:
        return '<p class="empty">no batches yet</p>'
    known = [v for values in series.values() for v in values if v is not None]
    top = max(known, default=0.0) or 1.0
    inner_w = WIDTH - _LEFT - _RIGHT
    inner_h = HEIGHT - _TOP - _BOTTOM
    step = inner_w / max(1, len(xs) - 1)
    body = []
    for n, values in enumerate(series.values()):
        colour = PALETTE[n % len(PALETTE)]
        path: list[str] = []
        for i, v in enumerate(values):
            if v is None:
                continue
            px = _LEFT + (i * step if len(xs) > 1 else inner_w / 2)
            py = _TOP + inner_h * (1 - v / top)
            path.append(f"{'L' if path else 'M'}{px:.1f},{py:.1f}")
            body.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.2" fill="{colour}">'
                f"<title>batch {xs[i]}: {_number(v)}{escape(unit)}</title></circle>"
            )
        if path:
            body.insert(0, f'<path d="{" ".join(path)}" stroke="{colour}" class="line"/>')
    return legend(list(series)) + _frame(xs, top, unit, body, label)
