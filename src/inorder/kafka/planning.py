"""Pure planning: from offsets and broker watermarks to the next offset and the input ranges.

Nothing here talks to Kafka. The stream reader gathers facts (which partitions exist, their
watermarks, where new ones start) and these functions turn them into decisions, so every rule
(fair read limits, data-loss detection, pruning, ticks, minimum batch sizes) is tested without
a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from inorder.kafka.offsets import SourceOffset
from inorder.records import TopicPartition

#: How a user skips lost records: the pipeline's TOML key, or the Spark source option.
SKIP_HINT = "set source.fail_on_data_loss = false (Spark option failOnDataLoss=false)"


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one topic-partition in one micro-batch: one Spark task."""

    tp: TopicPartition
    start: int
    end: int

    @property
    def size(self) -> int:
        """Number of offsets covered (records plus any gaps)."""
        return self.end - self.start


@dataclass(frozen=True)
class Watermarks:
    """Log-start offset (``low``) and readable end (``high``: LSO under read_committed)."""

    low: int
    high: int


class LossKind(Enum):
    """Why records the query was going to read are gone."""

    EXPIRED = "expired"  # start offset below the log-start offset (retention, delete_records)
    RESET = "reset"  # start offset above the partition's end (topic deleted and recreated)
    DELETED = "deleted"  # the topic-partition disappeared with unread records


@dataclass(frozen=True)
class LossEvent:
    """One detected data loss, with everything an operator needs to locate it."""

    tp: TopicPartition
    kind: LossKind
    expected: int
    available: int | None

    @property
    def lost_records(self) -> int:
        """Upper bound of offsets lost (gaps included); 0 when unknown."""
        if self.kind is LossKind.EXPIRED and self.available is not None:
            return self.available - self.expected
        if self.kind is LossKind.DELETED and self.available is not None:
            return max(0, self.available - self.expected)
        return 0

    def message(self) -> str:
        """One line naming topic, partition, expected and available offsets."""
        where = f"topic {self.tp.topic!r} partition {self.tp.partition}"
        if self.kind is LossKind.EXPIRED:
            return (
                f"data loss in {where}: expected offset {self.expected} but the earliest "
                f"available offset is {self.available} ({self.lost_records} offsets expired "
                f"by retention or were deleted); {SKIP_HINT} to skip them"
            )
        if self.kind is LossKind.RESET:
            return (
                f"data loss in {where}: expected offset {self.expected} but the partition "
                f"now ends at {self.available} (topic deleted and recreated?); "
                f"{SKIP_HINT} to start it over"
            )
        return (
            f"data loss in {where}: the topic-partition was deleted before offsets "
            f"{self.expected}..{self.available} were read; {SKIP_HINT} to skip them"
        )


def plan_ranges(start: SourceOffset, end: SourceOffset, *, markers: bool) -> list[OffsetRange]:
    """Input ranges of the micro-batch ``(start, end]``, ordered by topic then partition.

    One range per topic-partition of ``end``. A partition that entered in this micro-batch
    (see :func:`next_offset`) begins at ``end.starts`` when it has records to read, else at
    its position in ``end`` (an empty range). With ``markers`` every known partition is
    planned (even an empty range: its task still emits the marker row); without, only ranges
    with offsets.
    """
    ranges = []
    for tp in sorted(end.positions):
        stop = end.positions[tp]
        begin = end.starts[tp] if tp in end.starts else start.positions.get(tp, stop)
        if begin > stop:
            # Only possible for a partition pruned and re-added at a lower offset within
            # one batch; the new incarnation starts at ``stop``.
            begin = stop
        if markers or stop > begin:
            ranges.append(OffsetRange(tp, begin, stop))
    return ranges


def split_ranges(ranges: list[OffsetRange], most: int) -> list[OffsetRange]:
    """Each range cut into consecutive ranges of at most ``most`` offsets.

    This is ``maxRecordsPerPartition``. The pieces of one topic-partition are read by
    different tasks, so their records are no longer one ordered stream: only for readers that
    do not need offset order.
    """
    pieces: list[OffsetRange] = []
    for r in ranges:
        if r.end - r.start <= most:
            pieces.append(r)
            continue
        for begin in range(r.start, r.end, most):
            pieces.append(OffsetRange(r.tp, begin, min(begin + most, r.end)))
    return pieces


def fair_share(backlogs: Mapping[TopicPartition, int], limit: int) -> dict[TopicPartition, int]:
    """Split ``limit`` offsets across partitions max-min fairly (water-filling).

    Every partition with a backlog gets an equal share; what a small partition does not need
    goes to the others. Leftover units (when the share does not divide) go to partitions in
    topic-partition order, so the result is deterministic.
    """
    granted = {tp: 0 for tp in backlogs}
    active = sorted(tp for tp, n in backlogs.items() if n > 0)
    remaining = max(0, limit)
    while active and remaining > 0:
        share = remaining // len(active)
        if share == 0:
            for tp in active[:remaining]:
                granted[tp] += 1
            break
        still = []
        for tp in active:
            give = min(share, backlogs[tp] - granted[tp])
            granted[tp] += give
            remaining -= give
            if granted[tp] < backlogs[tp]:
                still.append(tp)
        active = still
    return granted


@dataclass(frozen=True)
class NextOffset:
    """Result of :func:`next_offset`: the proposed end offset and what was detected."""

    offset: SourceOffset
    losses: tuple[LossEvent, ...]
    available: int  # offsets available beyond ``start`` (new partitions included; before caps)
    new_partitions: tuple[TopicPartition, ...]
    pruned: tuple[TopicPartition, ...]


def next_offset(
    start: SourceOffset,
    *,
    watermarks: Mapping[TopicPartition, Watermarks],
    gone: Iterable[TopicPartition] = (),
    last_known_high: Mapping[TopicPartition, int] | None = None,
    new_starts: Mapping[TopicPartition, int] | None = None,
    max_offsets: int | None = None,
    target: Mapping[TopicPartition, int] | None = None,
    tick: int | None = None,
) -> NextOffset:
    """The end offset of the next micro-batch starting at ``start``.

    ``watermarks`` covers every partition of ``start`` that still exists; ``gone`` lists those
    that disappeared (pruned; a loss if ``last_known_high`` shows unread records).
    ``new_starts`` gives the starting position of partitions not yet in ``start``: they are
    read in this very micro-batch, from that position (recorded in the end offset's
    ``starts``, so Spark's offset log holds it with the first range read). A starting position
    outside the partition's readable log (an explicit offset below its log start or past its
    end) enters the offset without reading; the next micro-batch applies the data-loss rules
    to it like to any other position.
    ``max_offsets`` caps the offsets added in this batch (fair across partitions);
    ``target`` (Trigger.AvailableNow) caps each partition at its position when the trigger
    was prepared. Losses are reported, not raised: the caller applies ``failOnDataLoss``;
    when it goes on, expired offsets are skipped and the counters in the offset grow.
    """
    last_known_high = last_known_high or {}
    gone_set = set(gone)
    losses: list[LossEvent] = []
    effective: dict[TopicPartition, int] = {}
    pruned: list[TopicPartition] = []
    # Partitions whose range begins past expired offsets: recorded in ``starts`` so the
    # range read starts at the log start (the skipped offsets are counted here, once, not
    # again by the task that would meet them).
    moved: dict[TopicPartition, int] = {}
    lost = 0
    for tp, pos in sorted(start.positions.items()):
        if tp in gone_set or tp not in watermarks:
            known = last_known_high.get(tp)
            if known is not None and known > pos:
                event = LossEvent(tp, LossKind.DELETED, pos, known)
                losses.append(event)
                lost += event.lost_records
            pruned.append(tp)
            continue
        wm = watermarks[tp]
        if pos < wm.low:
            event = LossEvent(tp, LossKind.EXPIRED, pos, wm.low)
            losses.append(event)
            lost += event.lost_records
            effective[tp] = moved[tp] = wm.low
        elif pos > wm.high:
            losses.append(LossEvent(tp, LossKind.RESET, pos, wm.high))
            pruned.append(tp)  # re-discovered later as a new partition
        else:
            effective[tp] = pos
    added: list[TopicPartition] = []
    entering: dict[TopicPartition, int] = {}
    parked: dict[TopicPartition, int] = {}
    for tp, pos in sorted((new_starts or {}).items()):
        if tp in effective or (tp in start.positions and tp not in pruned):
            continue
        added.append(tp)
        marks = watermarks.get(tp)
        if marks is not None and marks.low <= pos <= marks.high:
            effective[tp] = entering[tp] = pos
        else:
            parked[tp] = pos
    backlogs = {}
    for tp, pos in effective.items():
        high = watermarks[tp].high
        if target is not None:
            high = min(high, target.get(tp, pos))
        backlogs[tp] = max(0, high - pos)
    available = sum(backlogs.values())
    if max_offsets is not None and available > max_offsets:
        granted = fair_share(backlogs, max_offsets)
    else:
        granted = backlogs
    positions = {tp: effective[tp] + granted[tp] for tp in effective}
    positions.update(parked)
    offset = SourceOffset(
        positions=positions,
        tick=tick,
        lost_records=start.lost_records + lost,
        pruned_partitions=start.pruned_partitions + len(pruned),
        # Only partitions with records to read need their start recorded: one that enters
        # with an empty range is planned from its position in ``positions`` next time.
        starts={
            **{tp: pos for tp, pos in entering.items() if positions[tp] > pos},
            **moved,
        },
    )
    return NextOffset(offset, tuple(losses), available, tuple(added), tuple(pruned))


def should_wait(
    *,
    available: int,
    min_offsets: int | None,
    seconds_since_last_batch: float,
    max_trigger_delay: float,
) -> bool:
    """Whether to hold a micro-batch back until ``min_offsets`` accumulate (minOffsetsPerTrigger).

    A batch runs anyway once ``max_trigger_delay`` seconds passed since the last one, so a
    trickle of records is never held forever.
    """
    if min_offsets is None or available >= min_offsets:
        return False
    return seconds_since_last_batch < max_trigger_delay


def next_tick(previous: int | None, now_ms: int, interval_ms: int) -> int:
    """The tick for wall-clock ``now_ms``: ``now_ms // interval_ms``, never going backwards."""
    current = now_ms // interval_ms
    return current if previous is None else max(previous, current)


def same_offset(a: SourceOffset, b: SourceOffset) -> bool:
    """Whether two offsets serialise identically (Spark would see no new data)."""
    return a.to_json() == b.to_json()


def nothing_new(end: SourceOffset, start: SourceOffset) -> bool:
    """Whether ``end`` adds nothing to ``start``.

    ``starts`` only describes the micro-batch that ended at an offset, so it is left out:
    otherwise the offset after a batch that started partitions would never look "the same"
    and Spark would run empty micro-batches.
    """
    return same_offset(end.without_starts(), start.without_starts())
