"""Where a topic-partition can be restarted with empty state: pure bookkeeping, no I/O.

Restarting a partition at offset ``R`` with no state gives the same output as the original
run from ``R`` on exactly when no key's *lifetime* straddles ``R``. A lifetime is the span
during which the engine holds an entry for a key (its state, or the "ignored" marker after a
``restart_session`` violation): it begins with the message that created the entry (or with a
message for which ``processor.starts_session`` is true, which replaces what was there) and
ends when the entry is dropped (``ctx.reset_session()``, e.g. an ``end`` message or an
inactivity timeout). A message of a lifetime other than its first *depends* on the state
before it, so ``R`` must not fall in ``(start, last dependent offset]`` of any lifetime; a
lifetime still open at the failure point may continue later, so ``R`` must be at or before
its start.

:class:`SpanTracker` records these forbidden intervals while the partition is applied in
offset order; :meth:`SpanTracker.cut` gives the latest clean restart offset at or below a
bound. Memory: one entry per open lifetime, plus closed intervals merged into their union
whenever they pile up.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Closed intervals kept before they are merged into their union.
_MERGE_EVERY = 100_000


@dataclass(frozen=True, slots=True)
class Cut:
    """A clean restart offset and why it is there."""

    offset: int
    key: str | None
    """The key whose lifetime (started at ``offset``) forced the cut back, if any."""
    open_keys: int
    """Keys holding state at the failure point (their sessions restart from their start)."""


class SpanTracker:
    """Key lifetimes of one topic-partition, fed record by record in offset order."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[int, int]] = {}  # key -> (start, last dependent offset)
        self._closed: list[tuple[int, int, str]] = []  # forbidden (start, end], key
        self._latest_start: dict[str, int] = {}
        self.watch: str | None = None
        """A key whose latest lifetime start is remembered (``--session``)."""

    def record(self, key: str, offset: int, starts: bool, present_after: bool) -> None:
        """One message of ``key`` at ``offset`` was applied; ``present_after``: key has an entry."""
        current = self._open.get(key)
        if current is not None and not starts:
            self._open[key] = (current[0], offset)  # depends on the state before it
        else:
            if current is not None:
                self._close(key, current)
            self._open[key] = (offset, offset)
            if key == self.watch:
                self._latest_start[key] = offset
        if not present_after:
            self._close(key, self._open.pop(key))

    def dropped(self, key: str) -> None:
        """``key``'s entry was dropped without a message (a timeout reset it)."""
        current = self._open.pop(key, None)
        if current is not None:
            self._close(key, current)

    def latest_start(self, key: str) -> int | None:
        """Start of the latest lifetime of the watched key, if it was seen."""
        return self._latest_start.get(key)

    def _close(self, key: str, span: tuple[int, int]) -> None:
        start, end = span
        if end > start:
            self._closed.append((start, end, key))
            if len(self._closed) >= _MERGE_EVERY:
                self._closed = _union(self._closed)

    def cut(self, bound: int) -> Cut:
        """The largest offset ``R <= bound`` that no lifetime straddles.

        Lifetimes still open count as reaching past ``bound``.
        """
        spans = list(self._closed)
        spans += [(start, max(end, bound), key) for key, (start, end) in self._open.items()]
        offset, blamed = bound, None
        for start, end, key in sorted(_union(spans), reverse=True):
            if start < offset <= end:
                offset, blamed = start, key
            elif end < offset:
                break
        return Cut(offset, blamed, len(self._open))


def _union(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Merge intervals ``(start, end]`` that overlap or touch (keeping the earliest key)."""
    merged: list[tuple[int, int, str]] = []
    for start, end, key in sorted(spans):
        if merged and start <= merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, key))
    return merged
