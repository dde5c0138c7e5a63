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

:class:`FuzzyTier` is the applier's part of the tier: arrivals, and the release of buffered
records merged with event-time timers as the watermark rises.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from inorder.engine.context import EVENT_TIME, EngineContext, from_micros
from inorder.engine.timers import TimerQueue, is_live
from inorder.engine.violations import ViolationEvent
from inorder.state.entry import KeyEntry

if TYPE_CHECKING:
    from inorder.codecs.base import Codec
    from inorder.processor import Processor
    from inorder.state.entry import StateView


class Applier(Protocol):
    """What the tier uses of :class:`~inorder.engine.apply.OrderedApplier` (its own part of
    the applier's steps; the applier is above and owns the tier)."""

    ctx: EngineContext
    codec: Codec[Any]
    processor: Processor[Any, Any, Any]
    failed: ViolationEvent | None
    _timers: dict[int, TimerQueue]
    _defer: list[tuple[int, str]] | None
    _et_hint: int | None

    def _get(self, key: str) -> KeyEntry | None: ...

    def _timeout(self, key: str, entry: KeyEntry) -> None: ...

    def _skip_ignored(self, key: str | None) -> bool: ...

    def _violation(
        self,
        rule: str,
        detail: str,
        key: str | None,
        offset: int,
        value: bytes | None,
        ts_us: int | None,
        kafka_key: bytes | None = None,
        policy: str | None = None,
    ) -> None: ...

    def _apply_msg(
        self,
        key: str,
        msg: Any,
        offset: int,
        kafka_key: bytes | None,
        value: bytes | None,
        ts_us: int | None,
        event_us: int | None,
    ) -> None: ...

    def _bug(self, exc: BaseException, key: str | None, offset: int, where: str) -> None: ...


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


class FuzzyTier:
    """The fuzzy tier inside one :class:`~inorder.engine.apply.OrderedApplier`."""

    def __init__(self, applier: Applier, view: StateView) -> None:
        self._applier = applier
        self.buffer = ReorderBuffer.from_entry(view.load(REORDER_KEY))

    def changes(self) -> dict[str, KeyEntry | None]:
        """The buffer's own state entry to write back, when it changed."""
        buffer = self.buffer
        if buffer.dirty:
            entry = buffer.to_entry()
            if entry is not None or buffer.existed:
                return {REORDER_KEY: entry}
        return {}

    def arrive(
        self,
        key: str,
        offset: int,
        kafka_key: bytes | None,
        value: bytes | None,
        ts_us: int | None,
        headers: Any,
        event_us: int | None,
    ) -> None:
        """A decoded record joins the reorder buffer, or is late."""
        applier = self._applier
        rule, detail = "", ""
        watermark = applier.ctx._watermark_us
        if event_us is None:
            rule = "missing_event_time"
            detail = "the record has no event time (fuzzy tier orders by event time)"
        elif watermark is not None and event_us < watermark:
            rule = "late"
            detail = (
                f"event time {from_micros(event_us).isoformat()} is behind the "
                f"watermark {from_micros(watermark).isoformat()}"
            )
        if rule:
            if not applier._skip_ignored(key):
                applier._violation(rule, detail, key, offset, value, ts_us, kafka_key)
            return
        assert event_us is not None
        self.buffer.push((event_us, offset, kafka_key, value, ts_us, headers))
        if watermark is not None and event_us <= watermark:
            self.advance(watermark)

    def advance(self, watermark: int) -> None:
        """The watermark reached ``watermark``: release records and fire event-time timers.

        Timers and buffered records are merged by time (a timer before a record of the same
        time, so a window closes before the next window's first record). Timers set by
        ``process`` during the pass join it; timers set by ``on_timeout`` wait for the next
        rise, so a timeout that re-arms itself in the past cannot loop.
        """
        applier = self._applier
        buffer = self.buffer
        queue = applier._timers[EVENT_TIME]
        deferred: list[tuple[int, str]] = []
        try:
            while applier.failed is None:
                timer = self._next_timer(watermark)
                head = buffer.head_time()
                if timer is None and (head is None or head > watermark):
                    break
                if timer is not None and (head is None or head > watermark or timer[0] <= head):
                    queue.pop()
                    entry = applier._get(timer[1])
                    assert entry is not None
                    applier._defer = deferred
                    try:
                        applier._timeout(timer[1], entry)
                    finally:
                        applier._defer = None
                else:
                    self._release(buffer.pop())
        finally:
            for deadline, key in deferred:
                queue.push(deadline, key)
            applier._et_hint = queue.hint()

    def _next_timer(self, upto: int) -> tuple[int, str] | None:
        """The earliest live event-time timer due at ``upto`` (left in the queue)."""
        applier = self._applier
        queue = applier._timers[EVENT_TIME]
        while (top := queue.peek_due(upto)) is not None:
            if is_live(applier._get(top[1]), top[0], EVENT_TIME):
                return top
            queue.pop()
        return None

    def _release(self, item: Buffered) -> None:
        """Process a buffered record (its turn in event-time order has come)."""
        event_us, offset, kafka_key, value, ts_us, headers = item
        applier = self._applier
        applier.ctx.set_record(offset, kafka_key, ts_us, headers)
        key: str | None = None
        try:
            msg = applier.codec.decode(value, kafka_key)
            key = applier.processor.key(msg)
            applier._apply_msg(key, msg, offset, kafka_key, value, ts_us, event_us)
        except Exception as exc:
            applier._bug(exc, key, offset, "process")
