"""Lists that stay one readable line at thousands of topics: the first few named, the rest
counted (``a, b, c and 997 more``), and counts of topics and partitions.

A pipeline reads one topic per collection site, often 1,000 and more: an output naming every
topic-partition is a wall nobody reads. Each list here names its first ``limit`` items and
says how many it left out, so nothing is dropped silently; the full lists stay in ``--json``
and behind ``--all``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
