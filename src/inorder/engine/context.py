"""The concrete :class:`~inorder.processor.Context` the engine hands to a processor.

One object per task (per topic-partition) is reused for every record: the hot path only
assigns a handful of slots. Times are kept as integer microseconds since the Unix epoch (UTC)
and turned into ``datetime`` only when a processor asks for them.

Requests a processor makes during a call (``set_timeout``, ``clear_timeout``,
``reset_session``) are buffered here and applied by the engine only when the call returns
normally: a call that raises :class:`~inorder.processor.Violation` leaves its key untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from inorder.records import Header

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Timer kinds (stored in state as small integers).
PROCESSING_TIME = 0
EVENT_TIME = 1

#: Pending timer request kinds.
TIMER_KEEP = 0
TIMER_SET = 1
TIMER_CLEAR = 2


def to_micros(when: datetime) -> int:
    """Microseconds since the epoch; a naive datetime is taken as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The UTC datetime of a microsecond timestamp."""
    return _EPOCH + timedelta(microseconds=micros)


def delta_micros(delta: timedelta) -> int:
    """A timedelta in whole microseconds."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class EngineContext:
    """Record coordinates and per-key controls for one topic-partition's task.

    Attributes are plain slots so the engine can update them per record at no cost;
    processors read them through the :class:`~inorder.processor.Context` protocol.
    """

    __slots__ = (
        "_dt_of_us",
        "_event_us",
        "_headers",
        "_processing_us",
        "_reset",
        "_timer_deadline",
        "_timer_kind",
        "_timer_op",
        "_ts_us",
        "_watermark_us",
        "batch_id",
        "current_key",
        "key",
        "offset",
        "partition",
        "topic",
    )

    def __init__(self, topic: str, partition: int, batch_id: int, processing_us: int) -> None:
        self.topic: str = topic
        self.partition: int = partition
        self.batch_id: int = batch_id
        self.offset: int = -1
        self.key: bytes | None = None
        self.current_key: str | None = None
        self._processing_us = processing_us
        self._ts_us: int | None = None
        # The last timestamp converted: consecutive records mostly share a Kafka timestamp
        # (milliseconds), and building a datetime per record was 6% of the session apply.
        self._dt_of_us: tuple[int, datetime] = (0, _EPOCH)
        self._event_us: int | None = None
        self._headers: Any = None
        self._watermark_us: int | None = None
        self._timer_op = TIMER_KEEP
        self._timer_deadline = 0
        self._timer_kind = PROCESSING_TIME
        self._reset = False

    # -- read side (Context protocol) --------------------------------------------------------

    @property
    def kafka_key(self) -> bytes | None:
        """The Kafka record's key (raw bytes)."""
        return self.key

    @property
    def state_key(self) -> str | None:
        """The state key of the current call."""
        return self.current_key

    @property
    def timestamp(self) -> datetime | None:
        """Kafka record timestamp (UTC), if any."""
        ts = self._ts_us
        if ts is None:
            return None
        cached = self._dt_of_us
        if cached[0] == ts:
            return cached[1]
        when = _EPOCH + timedelta(microseconds=ts)
        self._dt_of_us = (ts, when)
        return when

    @property
    def headers(self) -> Sequence[Header]:
        """Kafka record headers as ``(key, value)`` pairs."""
        raw = self._headers
        if not raw:
            return ()
        return tuple((h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1]) for h in raw)

    @property
    def watermark(self) -> datetime | None:
        """This partition's event-time watermark (max event time seen minus lateness)."""
        wm = self._watermark_us
        return None if wm is None else from_micros(wm)

    @property
    def processing_time(self) -> datetime:
        """The micro-batch's processing time (stable across re-runs of the batch)."""
        return from_micros(self._processing_us)

    # -- engine side -------------------------------------------------------------------------

    def set_record(
        self,
        offset: int,
        key: bytes | None,
        ts_us: int | None,
        headers: Any,
    ) -> None:
        """Point the context at a new record (hot path)."""
        self.offset = offset
        self.key = key
        self._ts_us = ts_us
        self._headers = headers
        self._event_us = ts_us

    def begin_call(self, state_key: str, event_us: int | None) -> None:
        """Reset the per-call requests before calling the processor for ``state_key``."""
        self.current_key = state_key
        self._event_us = event_us
        self._timer_op = TIMER_KEEP
        self._reset = False

    # -- write side (Context protocol) -------------------------------------------------------

    def set_timeout(self, when: timedelta | datetime, *, event_time: bool = False) -> None:
        """Ask for ``on_timeout`` of the current key once ``when`` has passed (replaces any)."""
        if isinstance(when, timedelta):
            if event_time:
                base = self._event_us if self._event_us is not None else self._watermark_us
                if base is None:
                    raise ValueError(
                        "set_timeout(timedelta, event_time=True): the record has no event "
                        "time and the partition has no watermark yet; pass a datetime"
                    )
            else:
                base = self._processing_us
            deadline = base + delta_micros(when)
        elif isinstance(when, datetime):
            deadline = to_micros(when)
        else:
            raise TypeError(f"set_timeout expects a timedelta or datetime, not {type(when)!r}")
        self._timer_op = TIMER_SET
        self._timer_deadline = deadline
        self._timer_kind = EVENT_TIME if event_time else PROCESSING_TIME

    def clear_timeout(self) -> None:
        """Cancel the current key's pending timeout."""
        self._timer_op = TIMER_CLEAR

    def reset_session(self) -> None:
        """Drop the current key's state once the call returns."""
        self._reset = True
