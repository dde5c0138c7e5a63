"""The ``inorder-kafka`` streaming data source (PySpark Python Data Source API).

Spark drives a :class:`KafkaStreamReader` on the driver (in a long-lived Python planner
process): ``initialOffset`` -> ``latestOffset(start, limit)`` -> ``partitions(start, end)`` ->
``commit(end)``. Each planned input partition (one per topic-partition range) is one Spark
task; ``read`` runs on an executor on a *pickled copy* of the reader, so it opens its own
consumer and relies on nothing but the options and the partition it is given.

How offsets evolve (see :mod:`inorder.kafka.offsets` for the JSON form):

* The initial offset is empty and flagged ``initial`` (the same on every call, so a replayed
  first micro-batch starts from the same offset). The first ``latestOffset`` discovers the
  partitions, resolves where each starts (``startingOffsets``) and plans the first range of
  each in the same micro-batch; later partitions (new topics, added partitions) enter the
  same way at ``newTopicStartingOffsets``. The end offset of the micro-batch in which a
  partition enters records its start (``starts``), so the starting position is in Spark's
  offset log before any of its records are read, and a replayed micro-batch (after a crash)
  plans exactly the same ranges: planning never asks the broker where a range starts.
* Topics that disappear are pruned from the offset (logged, counted in ``prunedPartitions``);
  losing unread records that way is data loss.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from inorder.errors import ConfigError, DataLossError, InorderError
from inorder.kafka.admin import KafkaAdmin
from inorder.kafka.batch_sizing import BatchSizer
from inorder.kafka.input_partitions import KafkaInputPartition, KafkaRangeGroup, group_ranges
from inorder.kafka.offsets import EARLIEST, LATEST, SourceOffset
from inorder.kafka.options import SourceOptions, parse_options
from inorder.kafka.planning import (
    Watermarks,
    next_offset,
    next_tick,
    nothing_new,
    plan_ranges,
    same_offset,
    should_wait,
    split_ranges,
)
from inorder.listing import named
from inorder.records import KAFKA_SPARK_DDL, TopicPartition

# The consumer and the high marks are imported where used: each of Spark's planner processes
# imports this module, and most need neither (pyarrow here only names types).
if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

SOURCE_NAME = "inorder-kafka"

#: Partitions an error message names (the rest are counted).
LISTED_PARTITIONS = 10


class KafkaDataSource(DataSource):
    """``spark.readStream.format("inorder-kafka")``: Kafka records in offset order."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return SOURCE_NAME

    def schema(self) -> str:
        """Spark's Kafka connector columns; options are validated here so ``load()`` fails early."""
        parse_options(dict(self.options))
        return KAFKA_SPARK_DDL

    def streamReader(self, schema: Any) -> KafkaStreamReader:
        """The micro-batch reader."""
        return KafkaStreamReader(parse_options(dict(self.options)))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver; reads them on executors."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._reset_driver_state()

    def _reset_driver_state(self) -> None:
        self._admin: KafkaAdmin | None = None
        self._known: list[TopicPartition] | None = None
        self._last_discovery = -math.inf
        self._last_high: dict[TopicPartition, int] = {}
        self._saved_high: dict[TopicPartition, int] | None = None
        self._target: dict[TopicPartition, int] | None = None
        self._last_batch = time.monotonic()
        self._latest: SourceOffset | None = None
        target = self._options.target_batch_duration
        self._sizer = None if target is None else BatchSizer(target.total_seconds())

    # Executors get a pickled copy: ship only the options, never clients or driver state.
    def __getstate__(self) -> dict[str, Any]:
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._options = state["_options"]
        self._reset_driver_state()

    def __repr__(self) -> str:
        return f"KafkaStreamReader({self._options.subscription})"

    # -- driver side -----------------------------------------------------------------------

    def _client(self) -> KafkaAdmin:
        if self._admin is None:
            self._admin = KafkaAdmin(self._options)
        return self._admin

    def _discover(self) -> list[TopicPartition]:
        admin = self._client()
        if self._known is None and (self._options.subscribe or self._options.assign):
            admin.check_subscription()  # only when the query starts: later, pruned quietly
        self._known = admin.discover()
        self._last_discovery = time.monotonic()
        return self._known

    def _known_partitions(self, force: bool = False) -> list[TopicPartition]:
        interval = self._options.topic_discovery_interval.total_seconds()
        if force or self._known is None or time.monotonic() - self._last_discovery >= interval:
            return self._discover()
        return self._known

    def initialOffset(self) -> dict[str, Any]:
        """An empty offset flagged ``initial``: ``startingOffsets`` applies at the first plan.

        Constant on purpose: Spark calls it again to replay a first micro-batch that did not
        commit, and the starting positions that batch read from are in its end offset.
        """
        return SourceOffset(initial=True).to_dict()

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxOffsetsPerTrigger)`` when set, else everything available."""
        if self._options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self._options.max_offsets_per_trigger)
        return super().getDefaultReadLimit()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the target: every partition known now, at its current end."""
        known = self._known_partitions(force=True)
        # A partition left out of the target would be silently never read by this query:
        # a topic listed with a metadata error (its partitions unknown) or a partition whose
        # end cannot be read is asked again briefly, then the run fails naming it.
        deadline = time.monotonic() + self._options.metadata_timeout_ms / 1000.0
        unsettled = self._client().unsettled_topics()
        while unsettled and time.monotonic() < deadline:
            time.sleep(0.5)
            known = self._discover()
            unsettled = self._client().unsettled_topics()
        if unsettled:
            raise InorderError(
                f"Trigger.AvailableNow: {len(unsettled):,} topic(s) of the subscription "
                f"({named(unsettled, LISTED_PARTITIONS)}) had a metadata error (no leader?) for "
                f"{self._options.metadata_timeout_ms} ms (inorder.metadataTimeoutMs): their "
                "partitions and ends are unknown, so the run cannot say where it ends"
            )
        marks, failed = self._client().watermarks(known)
        while failed and time.monotonic() < deadline:
            time.sleep(0.5)
            more, failed = self._client().watermarks(failed)
            marks.update(more)
        if failed:
            names = named([str(tp) for tp in sorted(failed)], LISTED_PARTITIONS)
            raise InorderError(
                f"Trigger.AvailableNow: the end offsets of {len(failed):,} partition(s) "
                f"({names}) could not be read within "
                f"{self._options.metadata_timeout_ms} ms (inorder.metadataTimeoutMs)"
            )
        self._target = {tp: wm.high for tp, wm in marks.items()}
        log.info("inorder-kafka: Trigger.AvailableNow target fixed for %d partitions", len(marks))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end offset of the next micro-batch (``start`` itself when nothing is new)."""
        opts = self._options
        begin = SourceOffset.from_dict(start)
        if self._saved_high is None:
            self._load_saved_highs()
        known = self._known_partitions(force=begin.initial)
        wanted = set(begin.positions) | set(known)
        marks, failed = self._client().watermarks(wanted)
        if failed:
            # A partition stopped answering: re-read the metadata now to tell a deleted
            # topic (pruned) from a transient error (kept, retried next trigger).
            known = self._known_partitions(force=True)
            still = [tp for tp in failed if tp in set(known)]
            if still:
                more, _ = self._client().watermarks(still)
                marks.update(more)
        known_set = set(known)
        # A topic listed with a metadata error still exists: pruning it would re-read it
        # from its start (as a new topic) once the error clears, duplicating every record.
        errored = self._client().errored_topics
        gone = [tp for tp in begin.positions if tp not in known_set and tp.topic not in errored]
        transient = {
            tp
            for tp in begin.positions
            if (tp not in marks) and (tp in known_set or tp.topic in errored)
        }
        new = [tp for tp in known if tp not in begin.positions and tp in marks]
        if self._target is not None:
            new = [tp for tp in new if tp in self._target]
        new_starts = self._starting_positions(new, marks, begin.initial)
        tick = self._tick(begin)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if self._sizer is not None:  # maxOffsetsPerTrigger stays a hard cap
            sized = self._sizer.limit(time.monotonic())
            max_rows = sized if max_rows is None else min(max_rows, sized)
        # Partitions that failed transiently keep their position this trigger.
        planning_marks = dict(marks)
        for tp in transient:
            planning_marks[tp] = Watermarks(begin.positions[tp], begin.positions[tp])
        result = next_offset(
            begin,
            watermarks=planning_marks,
            gone=gone,
            last_known_high=self._last_high,
            new_starts=new_starts,
            max_offsets=max_rows,
            target=self._target,
            tick=tick,
        )
        for i, event in enumerate(result.losses):
            if opts.fail_on_data_loss:
                raise DataLossError(event.message())
            if i < LISTED_PARTITIONS:
                log.warning("inorder-kafka: skipping: %s", event.message())
        if len(result.losses) > LISTED_PARTITIONS:
            log.warning(
                "inorder-kafka: skipping lost offsets of %d more partition(s) too",
                len(result.losses) - LISTED_PARTITIONS,
            )
        if result.pruned:
            # Deleting the topics of many sites at once: one line, not one per partition.
            log.warning(
                "inorder-kafka: %d partition(s) gone; pruned from the plan: %s",
                len(result.pruned),
                named([str(tp) for tp in result.pruned], LISTED_PARTITIONS),
            )
        for tp, wm in marks.items():
            self._last_high[tp] = wm.high
        for tp in result.pruned:
            # Its loss (if any) is counted now; a topic re-created under the same name
            # enters again as new, with ends of its own.
            self._last_high.pop(tp, None)
        self._latest = SourceOffset(
            positions={tp: marks[tp].high for tp in result.offset.positions if tp in marks}
        )
        end = result.offset
        now = time.monotonic()
        if (
            self._target is None
            and not result.new_partitions
            and not result.pruned
            and not result.losses
            and should_wait(
                available=result.available,
                min_offsets=opts.min_offsets_per_trigger,
                seconds_since_last_batch=now - self._last_batch,
                max_trigger_delay=opts.max_trigger_delay.total_seconds(),
            )
        ):
            end = SourceOffset(
                positions=begin.positions,
                tick=tick,
                lost_records=begin.lost_records,
                pruned_partitions=begin.pruned_partitions,
            )
        self._save_highs(end)
        if nothing_new(end, begin):
            return start
        self._last_batch = now
        if self._sizer is not None and max_rows is not None:
            self._sizer.planned(min(result.available, max_rows), max_rows, now)
        return end.to_dict()

    def _load_saved_highs(self) -> None:
        """Start from the ends the previous run saw (a restart's only view of deleted topics)."""
        from inorder.kafka.high_marks import load_high_marks

        path = self._options.high_watermarks_file
        self._saved_high = {} if path is None else load_high_marks(path)
        for tp, high in self._saved_high.items():
            self._last_high.setdefault(tp, high)

    def _save_highs(self, end: SourceOffset) -> None:
        """Keep the ends seen while any partition stays behind them after this plan.

        Offsets up to ``end`` are in Spark's offsets log before they are read; only a backlog
        beyond it (a capped batch, ``minOffsetsPerTrigger`` waiting) would be invisible to a
        restart that finds its topic deleted. Written only when it changed.
        """
        from inorder.kafka.high_marks import save_high_marks

        path = self._options.high_watermarks_file
        if path is None or self._last_high == self._saved_high:
            return
        behind = any(self._last_high.get(tp, pos) > pos for tp, pos in end.positions.items())
        if behind and save_high_marks(path, self._last_high):
            self._saved_high = dict(self._last_high)

    def _tick(self, begin: SourceOffset) -> int | None:
        interval = self._options.tick_interval_ms
        if interval is None:
            return None
        if self._target is not None:
            return begin.tick  # AvailableNow must converge: the clock does not advance it
        return next_tick(begin.tick, int(time.time() * 1000), interval)

    def _starting_positions(
        self, new: Sequence[TopicPartition], marks: dict[TopicPartition, Watermarks], initial: bool
    ) -> dict[TopicPartition, int]:
        opts = self._options
        if not new:
            return {}
        if not initial:
            pick_low = opts.new_topic_starting_offsets == "earliest"
            return {tp: marks[tp].low if pick_low else marks[tp].high for tp in new}
        if opts.starting_offsets in ("earliest", "latest"):
            pick_low = opts.starting_offsets == "earliest"
            return {tp: marks[tp].low if pick_low else marks[tp].high for tp in new}
        if opts.starting_offsets == "json":
            missing = [str(tp) for tp in new if tp not in opts.starting_positions]
            if missing:
                raise ConfigError(
                    f"startingOffsets: no offset given for {len(missing):,} partition(s) "
                    + f"({named(missing, LISTED_PARTITIONS)})"
                    + f" (use {EARLIEST} for earliest, {LATEST} for latest)"
                )
            out = {}
            for tp in new:
                pos = opts.starting_positions[tp]
                out[tp] = (
                    marks[tp].low if pos == EARLIEST else marks[tp].high if pos == LATEST else pos
                )
            return out
        if opts.starting_timestamp is not None:
            times = {tp: opts.starting_timestamp for tp in new}
        else:
            missing = [str(tp) for tp in new if tp not in opts.starting_timestamps]
            if missing:
                raise ConfigError(
                    f"startingOffsetsByTimestamp: no timestamp given for {len(missing):,} "
                    f"partition(s) ({named(missing, LISTED_PARTITIONS)})"
                )
            times = {tp: opts.starting_timestamps[tp] for tp in new}
        found = self._client().offsets_for_times(times)
        # No record at or after the timestamp: start at the end (only newer records).
        out_ts: dict[TopicPartition, int] = {}
        for tp in new:
            at = found.get(tp)
            out_ts[tp] = at if at is not None else marks[tp].high
        return out_ts

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Latest readable offsets seen at the last plan (Spark shows them as ``latestOffset``)."""
        return self._latest.to_dict() if self._latest is not None else None

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        """One input partition per topic-partition range, ordered by topic then partition.

        With ``maxRecordsPerPartition`` a longer range becomes several input partitions; with
        ``inorder.rangeGroups`` (ranges only) the ranges are packed into that many groups.
        """
        begin, stop = SourceOffset.from_dict(start), SourceOffset.from_dict(end)
        if same_offset(begin, stop):
            return []
        ranges = plan_ranges(begin, stop, markers=self._options.partition_markers)
        if self._options.max_records_per_partition is not None:
            ranges = split_ranges(ranges, self._options.max_records_per_partition)
        groups = self._options.range_groups
        if groups and len(ranges) > groups:
            return list(
                group_ranges([(r.tp.topic, r.tp.partition, r.start, r.end) for r in ranges], groups)
            )
        return [KafkaInputPartition(r.tp.topic, r.tp.partition, r.start, r.end) for r in ranges]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in consumer groups."""

    def stop(self) -> None:
        """Drop the admin client."""
        self._admin = None

    # -- executor side ---------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Records of one range, in offset order (after the marker row, if enabled)."""
        from inorder.kafka.consumer import marker_batch, markers_batch, read_range

        if isinstance(partition, KafkaRangeGroup):  # ranges only: the markers are all
            yield markers_batch([(TopicPartition(t, p), s, e) for t, p, s, e in partition.ranges])
            return
        assert isinstance(partition, KafkaInputPartition)
        tp = TopicPartition(partition.topic, partition.partition)
        if self._options.ranges_only:  # the engine task reads the range itself
            yield marker_batch(tp, partition.start, partition.end)
            return
        yield from read_range(self._options, tp, partition.start, partition.end)
