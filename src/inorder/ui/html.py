"""The status page's HTML pieces: numbers, sizes, times and tables (every value escaped)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any


def num(value: Any) -> str:
    """A number with thousands separators (a dash for ``None``), or escaped text."""
    if value is None:
        return '<span class="muted">&ndash;</span>'
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))


def size_bytes(value: int | None) -> str:
    """A byte count in B, KiB, MiB or GiB."""
    if value is None:
        return num(None)
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return f"{size:,.1f} TiB"


def timestamp(value: str | None) -> str:
    """An ISO 8601 time as a ``<time>`` element."""
    if not value:
        return num(None)
    return f'<time datetime="{escape(value)}">{escape(value.replace("T", " ")[:19])}</time>'


def table(
    head: Sequence[tuple[str, bool]], rows: Iterable[Sequence[str]], row_attrs: Sequence[str] = ()
) -> str:
    """A table; ``head`` is (title, numeric); cells are already HTML."""
    cells = "".join(f'<th class="{"num" if num else ""}">{escape(t)}</th>' for t, num in head)
    body = []
    for i, row in enumerate(rows):
        attrs = row_attrs[i] if i < len(row_attrs) else ""
        tds = "".join(
            f'<td class="{"num" if head[j][1] else ""}">{cell}</td>' for j, cell in enumerate(row)
        )
        body.append(f"<tr{attrs}>{tds}</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(head)}" class="empty">none</td></tr>')
    return f'<div class="scroll"><table><thead><tr>{cells}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'  # noqa: E501
