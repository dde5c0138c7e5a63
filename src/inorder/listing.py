"""Lists that stay one readable line at thousands of topics: the first few named, the rest
counted (``a, b, c and 997 more``), and counts of topics and partitions.

A pipeline reads one topic per collection site, often 1,000 and more: an output naming every
topic-partition is a wall nobody reads. Each list here names its first ``limit`` items and
says how many it left out, so nothing is dropped silently; the full lists stay in ``--json``
and behind ``--all``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

#: Items a summarised list names before counting the rest.
NAMED = 5


def named(items: Sequence[str], limit: int = NAMED, sep: str = ", ") -> str:
    """``items`` joined, the first ``limit`` named and the rest counted ("and K more")."""
    shown = sep.join(items[:limit])
    left = len(items) - limit
    if left > 0:
        return f"{shown} and {left:,} more"
    return shown


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 topic``, ``1,000 topics``."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def topics_and_partitions(names: Iterable[str]) -> str:
    """``1,000 topics, 4,000 partitions`` for topic-partition names ``topic[p]``."""
    tps = list(names)
    topics = {name.rpartition("[")[0] or name for name in tps}
    return f"{count(len(topics), 'topic')}, {count(len(tps), 'partition')}"


#: Offset ranges a line lists one by one (beyond: counts and the largest ranges).
RANGES_LISTED = 10


def ranges_text(
    ranges: Mapping[str, Sequence[int]],
    render: Callable[[str, Sequence[int]], str],
    full: bool = False,
) -> str:
    """Offset ranges by ``topic[p]``, each ``render``-ed: all of them up to
    :data:`RANGES_LISTED` (or ``full``), else the counts and the :data:`NAMED` ranges with
    the most offsets (a range starting below 0 is of unknown start)."""
    if full or len(ranges) <= RANGES_LISTED:
        return ", ".join(render(tp, r) for tp, r in ranges.items())

    def size(r: Sequence[int]) -> int:
        return r[1] - r[0] if r[0] >= 0 else 0

    filled = sorted((i for i in ranges.items() if size(i[1]) > 0), key=lambda i: -size(i[1]))
    text = f"{topics_and_partitions(ranges)}, {len(filled):,} with records"
    unknown = sum(1 for r in ranges.values() if r[0] < 0)
    if unknown:
        text += f", {unknown:,} of unknown start"
    if filled:
        text += ": " + named([render(tp, r) for tp, r in filled])
    return text
