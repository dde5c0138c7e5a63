"""Per-minute stats per site over event time: the ``fuzzy`` integrity tier at work.

Sensors publish readings ``{"site": "s1", "value": 2.5, "ts": 1731000000.25}`` keyed by site;
``ts`` is when the reading was taken, and readings reach Kafka somewhat out of order. With
``Integrity.fuzzy(lateness=30 s)`` inorder hands each site's readings to ``process`` in
event-time order (a reorder buffer kept in the checkpointed state), and readings more than
30 s behind the newest one of their partition are *late*: counted and dead-lettered.

The processor keeps one open tumbling minute per site and closes it with an event-time
timeout at the minute's end, which fires once the partition's watermark passes it, before
any reading of the next minute is processed.

    inorder run examples/fuzzy_windows.toml

or from Python: ``inorder run examples.fuzzy_windows:pipeline --trigger available-now``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from inorder import Context, Integrity, Processor

WINDOW = timedelta(minutes=1)
_WINDOW_S = int(WINDOW.total_seconds())


@dataclass
class Reading:
    """A sensor reading; ``ts`` is its event time (seconds since the epoch)."""

    site: str
    value: float
    ts: float


@dataclass
class OpenMinute:
    """Per-site state: the minute being aggregated (``start`` < 0: none open)."""

    start: int = -1
    count: int = 0
    total: float = 0.0
    low: float = 0.0
    high: float = 0.0


@dataclass
class MinuteStats:
    """One closed minute of one site."""

    site: str
    window_start: datetime
    window_end: datetime
    count: int
    mean: float
    low: float
    high: float


def minute_of(ts: float) -> int:
    """Start (epoch seconds) of the minute holding ``ts``."""
    return int(ts // _WINDOW_S) * _WINDOW_S


class MinuteWindows(Processor[Reading, OpenMinute, MinuteStats]):
    """Tumbling one-minute windows per site, emitted when the watermark passes their end."""

    def key(self, msg: Reading) -> str:
        """Windows are per site."""
        return msg.site

    def initial_state(self, key: str) -> OpenMinute:
        """No minute open yet."""
        return OpenMinute()

    def event_time(self, msg: Reading, ctx: Context) -> datetime | None:
        """The reading's own time, not the Kafka timestamp."""
        return datetime.fromtimestamp(msg.ts, tz=UTC)

    def default_integrity(self) -> Integrity:
        """Event-time order within 30 seconds; later readings are dead-lettered."""
        return Integrity.fuzzy(lateness=timedelta(seconds=30))

    def process(self, state: OpenMinute, msg: Reading, ctx: Context) -> Iterable[MinuteStats]:
        """Add the reading to its minute (readings of a site arrive in event-time order)."""
        start = minute_of(msg.ts)
        rows: list[MinuteStats] = []
        if state.start >= 0 and state.start != start:
            # Only if the timer could not fire first (it always can under the fuzzy tier).
            rows.append(self._close(state, msg.site))
        if state.start != start:
            state.start, state.count, state.total = start, 0, 0.0
            state.low = state.high = msg.value
            ctx.set_timeout(datetime.fromtimestamp(start + _WINDOW_S, tz=UTC), event_time=True)
        state.count += 1
        state.total += msg.value
        state.low = min(state.low, msg.value)
        state.high = max(state.high, msg.value)
        return rows

    def on_timeout(self, state: OpenMinute, key: str, ctx: Context) -> Iterable[MinuteStats]:
        """The watermark passed the minute's end: emit it."""
        if state.start < 0:
            return []
        return [self._close(state, key)]

    @staticmethod
    def _close(state: OpenMinute, site: str) -> MinuteStats:
        row = MinuteStats(
            site,
            datetime.fromtimestamp(state.start, tz=UTC),
            datetime.fromtimestamp(state.start + _WINDOW_S, tz=UTC),
            state.count,
            state.total / state.count,
            state.low,
            state.high,
        )
        state.start, state.count, state.total = -1, 0, 0.0
        return row


def _pipeline() -> object:
    from inorder import KafkaSource, ParquetSink, Pipeline
    from inorder.endpoints import kafka_bootstrap_servers

    base = os.environ.get("INORDER_EXAMPLE_DIR", ".inorder/fuzzy-windows")
    return Pipeline(
        source=KafkaSource(
            bootstrap_servers=kafka_bootstrap_servers(),
            topic_pattern=os.environ.get("INORDER_EXAMPLE_TOPICS", "readings-.*"),
        ),
        processor=MinuteWindows(),
        sink=ParquetSink(f"{base}/output"),
        dead_letter=ParquetSink(f"{base}/late"),
        checkpoint=f"{base}/checkpoint",
    )


def __getattr__(name: str) -> object:
    # ``pipeline`` is built on first access so importing the module needs no broker.
    if name == "pipeline":
        return _pipeline()
    raise AttributeError(name)
