"""What the engine keeps per key and per topic-partition, independent of where it is stored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class KeyEntry:
    """Everything the engine knows about one key of a topic-partition.

    ``state`` is the processor's state object (``None`` while the key is ignored after a
    ``restart_session`` violation). ``last_offset``/``last_ts``/``kafka_key`` describe the last
    record applied to the key: rows emitted by a timeout carry that offset. ``seq`` is the
    last accepted producer sequence (when a sequence field is declared). A key has at most one
    pending timer: ``timer`` (microseconds) of kind ``timer_kind``.
    """

    __slots__ = (
        "ignored",
        "kafka_key",
        "last_offset",
        "last_ts",
        "seq",
        "state",
        "timer",
        "timer_kind",
    )

    def __init__(
        self,
        state: Any,
        last_offset: int = -1,
        last_ts: int | None = None,
        kafka_key: bytes | None = None,
        seq: int | None = None,
        timer: int | None = None,
        timer_kind: int = 0,
        ignored: bool = False,
    ) -> None:
        self.state = state
        self.last_offset = last_offset
        self.last_ts = last_ts
        self.kafka_key = kafka_key
        self.seq = seq
        self.timer = timer
        self.timer_kind = timer_kind
        self.ignored = ignored

    def __repr__(self) -> str:
        return (
            f"KeyEntry(state={self.state!r}, last_offset={self.last_offset}, seq={self.seq}, "
            f"timer={self.timer}, timer_kind={self.timer_kind}, ignored={self.ignored})"
        )


@dataclass(slots=True)
class PartitionMeta:
    """Per topic-partition progress kept with the state.

    ``last_offset`` is the highest offset consumed (applied, skipped as a violation or ignored);
    a record at or below it is a replay. ``max_event_us`` is the highest event time seen, the
    base of the partition's watermark.
    """

    last_offset: int = -1
    max_event_us: int | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {"last_offset": self.last_offset, "max_event_us": self.max_event_us}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartitionMeta:
        """Inverse of :meth:`to_json`."""
        mx = data.get("max_event_us")
        return cls(int(data.get("last_offset", -1)), None if mx is None else int(mx))


class StateView(Protocol):
    """Read access to the committed state of one topic-partition (before this batch)."""

    def load(self, key: str) -> KeyEntry | None:
        """The entry of ``key``, or ``None`` when the key has none."""
        ...

    def timers_after(
        self, kind: int, after: tuple[int, str] | None, limit: int
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` timers ``(deadline, key)`` of ``kind`` after ``after``, in order."""
        ...
