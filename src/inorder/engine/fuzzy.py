"""The reorder buffer of the ``fuzzy`` tier, and how it is kept in the state store.

Under ``Integrity.fuzzy(lateness=L)`` a record is not processed when it arrives: it waits in
a reorder buffer until the partition's watermark (max event time seen - ``L``) reaches its
event time, and buffered records are released in ``(event time, offset)`` order. A record
whose event time is already behind the watermark when it arrives is *late* (rule ``late``).

The buffer is part of the partition's state: it is stored under the reserved key
:data:`REORDER_KEY` of the same store, as one entry written with the keys' entries of the
batch (so it is versioned by batch id and survives crashes exactly like them). That entry is
marked ``ignored`` with no state object, and its records travel in the entry's raw-bytes
column (``kafka_key``) as MessagePack: the user's state codec never sees it.
"""

from __future__ import annotations

import heapq
from typing import Any

import msgspec

from inorder.state.entry import KeyEntry

#: The reserved state key holding a partition's reorder buffer (NUL: never a user key).
REORDER_KEY = "\x00inorder.reorder"

#: A buffered record: ``(event_us, offset, kafka_key, value, ts_us, headers)``.
Buffered = tuple[int, int, bytes | None, bytes | None, int | None, Any]

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder()


def _plain_headers(headers: Any) -> Any:
    if not headers:
        return None
    return [[h["key"], h["value"]] if isinstance(h, dict) else [h[0], h[1]] for h in headers]


class ReorderBuffer:
    """A heap of buffered records ordered by ``(event time, offset)``."""

    __slots__ = ("dirty", "existed", "heap")

    def __init__(self, items: list[Buffered] | None = None, existed: bool = False) -> None:
        self.heap: list[Buffered] = items or []
        heapq.heapify(self.heap)
        self.dirty = False
        self.existed = existed

    @classmethod
    def from_entry(cls, entry: KeyEntry | None) -> ReorderBuffer:
        """The buffer stored in ``entry`` (empty when there is none)."""
        if entry is None or entry.kafka_key is None:
            return cls(existed=entry is not None)
        raw = _DECODER.decode(entry.kafka_key)
        items: list[Buffered] = [
            (
                int(r[0]),
                int(r[1]),
                r[2],
                r[3],
                r[4],
                None if r[5] is None else [(h[0], h[1]) for h in r[5]],
            )
            for r in raw
        ]
        return cls(items, existed=True)

    def to_entry(self) -> KeyEntry | None:
        """The entry to store (``None``: delete it, the buffer is empty)."""
        if not self.heap:
            return None
        items = sorted(self.heap)
        payload = _ENCODER.encode(
            [[e, o, k, v, t, _plain_headers(h)] for e, o, k, v, t, h in items]
        )
        return KeyEntry(None, last_offset=items[-1][1], kafka_key=payload, ignored=True)

    def push(self, item: Buffered) -> None:
        """Buffer a record."""
        heapq.heappush(self.heap, item)
        self.dirty = True

    def head_time(self) -> int | None:
        """Event time of the earliest buffered record (``None`` when empty)."""
        return self.heap[0][0] if self.heap else None

    def pop(self) -> Buffered:
        """Remove and return the earliest buffered record."""
        self.dirty = True
        return heapq.heappop(self.heap)

    def __len__(self) -> int:
        return len(self.heap)
