"""The pending timers of one topic-partition, merged from the state store and this batch.

A key has at most one timer, kept in its :class:`~inorder.state.entry.KeyEntry`. The store
hands out its timers in ``(deadline, key)`` order, a chunk at a time; timers set during the
batch join them in a heap. A candidate is only a hint: the key's entry may have changed in
this batch (timer cleared, moved, key deleted), so whoever pops a candidate checks it against
the entry (:func:`is_live`).
"""

from __future__ import annotations

import heapq
from typing import Protocol

from inorder.state.entry import KeyEntry

_CHUNK = 1024


class TimerSource(Protocol):
    """Where the committed timers come from (the state view of the partition)."""

    def timers_after(
        self, kind: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` timers ``(deadline, key)`` of ``kind`` after ``after``, in order."""
        ...


def is_live(entry: KeyEntry | None, deadline: int, kind: int) -> bool:
    """Whether the candidate ``(deadline, kind)`` is still the timer of ``entry``."""
    return entry is not None and entry.timer == deadline and entry.timer_kind == kind


class TimerQueue:
    """Candidate timers of one kind, earliest first.

    The heap holds this batch's timers and the store timers pulled so far; ``_cursor`` is the
    last store timer pulled and ``_exhausted`` says the store has none after it. Before the
    heap's top is trusted, :meth:`peek_due` pulls store timers until the top is the earliest
    of both.
    """

    def __init__(self, source: TimerSource, kind: int) -> None:
        self._source = source
        self._kind = kind
        self._heap: list[tuple[int, str]] = []
        self._cursor: tuple[int, str] | None = None
        self._exhausted = False

    def refill(self) -> None:
        """Pull store timers into the heap until its top is the global minimum."""
        heap = self._heap
        while not self._exhausted:
            cursor = self._cursor
            if heap and cursor is not None and heap[0] <= cursor:
                return
            chunk = self._source.timers_after(self._kind, cursor, _CHUNK)
            for item in chunk:
                heapq.heappush(heap, item)
            if len(chunk) < _CHUNK:
                self._exhausted = True
            if chunk:
                self._cursor = chunk[-1]

    def hint(self) -> int | None:
        """A lower bound of the next due deadline (``None``: no timer at all)."""
        best = self._heap[0][0] if self._heap else None
        cursor = self._cursor
        if not self._exhausted and cursor is not None and (best is None or cursor[0] < best):
            best = cursor[0]
        return best

    def peek_due(self, upto: int) -> tuple[int, str] | None:
        """The earliest candidate with a deadline at or before ``upto``, left in place."""
        self.refill()
        heap = self._heap
        return heap[0] if heap and heap[0][0] <= upto else None

    def pop(self) -> tuple[int, str]:
        """Remove and return the earliest candidate (after :meth:`peek_due` found it)."""
        return heapq.heappop(self._heap)

    def push(self, deadline: int, key: str) -> None:
        """A timer set in this batch."""
        heapq.heappush(self._heap, (deadline, key))
