"""Recomputing one topic-partition in plain Python with the engine's own apply core.

:class:`PartitionRecompute` reads the partition from Kafka in chunks and drives
:class:`~inorder.engine.apply.OrderedApplier` (the code the Spark tasks run) over in-memory
state, batch by batch. When the checkpoint still holds the batch history it reproduces the
real run's micro-batch boundaries and processing times, so processing-time timeouts fire
exactly where they fired in the real run; otherwise the partition is applied as one batch at
processing time 0 (the epoch): no processing-time timeout fires.

It yields :class:`Chunk` objects: the rows for a contiguous offset range ``[start, end)``,
complete except for rows emitted later by timeouts of keys whose last record lies before
``start`` (those come as ``late`` rows of a later chunk). The last chunk is marked ``final``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from inorder.engine.apply import OrderedApplier
from inorder.engine.reference import DictStateView
from inorder.engine.violations import ViolationEvent
from inorder.ops.batchlog import BatchLog, Segment
from inorder.ops.kafka_reads import SegmentedRead
from inorder.ops.target import OpsTarget
from inorder.records import TopicPartition
from inorder.state.entry import KeyEntry, PartitionMeta

#: Records applied between two chunks (bounded memory: rows of this many records).
DEFAULT_CHUNK_RECORDS = 50_000


@dataclass(frozen=True, slots=True)
class Chunk:
    """Recomputed rows of ``[start, end)`` (``batch_id`` column dropped), plus late rows."""

    start: int
    end: int
    rows: pa.Table | None
    late: pa.Table | None
    records: int
    final: bool = False


def plan_segments(
    log: BatchLog | None,
    tp: TopicPartition,
    start: int,
    end: int | None,
    upto_batch: int | None,
) -> tuple[list[Segment], bool]:
    """Batches to apply for ``tp`` from ``start``: the logged ones, else one big batch.

    Returns the segments and whether they reproduce the real batches exactly (the log covers
    ``start`` with processing times). ``end`` bounds the single batch of the fallback.
    """
    logged = log.segments(tp, upto_batch) if log is not None else []
    if logged and (logged[0].start is None or logged[0].start <= start) and log and log.complete:
        segs = [s for s in logged if s.end > start or s is logged[-1]]
        exact = all(s.processing_time_us is not None for s in segs)
        return segs, exact
    if logged:
        # The log was pruned: apply what precedes it as one batch, then the logged batches.
        first_start = logged[0].start if logged[0].start is not None else logged[0].end
        head = [Segment(-1, start, first_start, None)] if first_start > start else []
        return head + [s for s in logged if s.end > start], False
    final = end if end is not None else start
    return [Segment(0, start, final, None)], False


class PartitionRecompute:
    """Applies one topic-partition's records from Kafka through the pipeline's processor."""

    def __init__(
        self,
        target: OpsTarget,
        tp: TopicPartition,
        entries: dict[str, KeyEntry] | None = None,
        meta: PartitionMeta | None = None,
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
    ) -> None:
        from inorder.schema import RowEncoder

        self.target = target
        self.tp = tp
        self.entries: dict[str, KeyEntry] = entries if entries is not None else {}
        self.meta = meta if meta is not None else PartitionMeta()
        self.chunk_records = chunk_records
        self.encoder: Any = RowEncoder(target.types.out)
        self.failed: ViolationEvent | None = None
        self.violation_counts: dict[str, int] = {}
        #: Records of keys reset under ``restart_session``, skipped until a new session.
        self.ignored = 0
        self.records = 0

    def _encode(self, rows: list[Any], offsets: list[int], batch_id: int) -> pa.Table | None:
        if not rows:
            return None
        batch = self.encoder.encode_with_origin(
            rows, self.tp.topic, self.tp.partition, offsets, batch_id
        )
        table = pa.Table.from_batches([batch])
        return table.drop_columns(["batch_id"]) if "batch_id" in table.column_names else table

    def _split(
        self, applier: OrderedApplier, batch_id: int, start: int
    ) -> tuple[pa.Table | None, pa.Table | None]:
        rows, offsets = applier.rows, applier.row_offsets
        if not rows:
            return None, None
        on_time = [i for i, o in enumerate(offsets) if o >= start]
        if len(on_time) == len(rows):
            table = self._encode(list(rows), list(offsets), batch_id)
            late = None
        else:
            late_idx = [i for i, o in enumerate(offsets) if o < start]
            table = self._encode(
                [rows[i] for i in on_time], [offsets[i] for i in on_time], batch_id
            )
            late = self._encode(
                [rows[i] for i in late_idx], [offsets[i] for i in late_idx], batch_id
            )
        rows.clear()
        offsets.clear()
        return table, late

    def run(self, segments: list[Segment], first_start: int) -> Iterator[Chunk]:
        """Apply the segments (in order) and yield chunks covering ``[first_start, last end)``."""
        target = self.target
        cursor = first_start
        chunk_start = first_start
        pending: list[pa.Table] = []
        late: list[pa.Table] = []
        in_chunk = 0

        def flush(end: int, final: bool = False) -> Chunk:
            nonlocal chunk_start, pending, late, in_chunk
            chunk = Chunk(
                chunk_start,
                end,
                pa.concat_tables(pending) if pending else None,
                pa.concat_tables(late) if late else None,
                in_chunk,
                final,
            )
            chunk_start, pending, late, in_chunk = end, [], [], 0
            return chunk

        # One consumer for the whole partition: the batches' ranges are cut from its read.
        read_to = max((s.end for s in segments), default=first_start)
        reader = SegmentedRead(target.source_options, self.tp, first_start, read_to)
        try:
            for seg in segments:
                if self.failed is not None:
                    break
                processing = seg.processing_time_us or 0
                applier = OrderedApplier(
                    target.processor,
                    target.codec,
                    target.integrity,
                    DictStateView(self.entries),
                    self.tp.topic,
                    self.tp.partition,
                    max(seg.batch_id, 0),
                    processing,
                    PartitionMeta(self.meta.last_offset, self.meta.max_event_us),
                    max_events=1000,
                )
                start = max(cursor, seg.start if seg.start is not None else cursor)
                for records in reader.upto(start, seg.end):
                    applier.apply(records)
                    in_chunk += len(records)
                    self.records += len(records)
                    table, lt = self._split(applier, seg.batch_id, chunk_start)
                    if table is not None:
                        pending.append(table)
                    if lt is not None:
                        late.append(lt)
                    if applier.failed is not None:
                        break
                    if in_chunk >= self.chunk_records:
                        yield flush(int(records[-1][0]) + 1)
                if applier.failed is None:
                    applier.finish()
                table, lt = self._split(applier, seg.batch_id, chunk_start)
                if table is not None:
                    pending.append(table)
                if lt is not None:
                    late.append(lt)
                for rule, n in applier.violation_counts.items():
                    self.violation_counts[rule] = self.violation_counts.get(rule, 0) + n
                self.ignored += applier.counters["ignored"]
                if applier.failed is not None:
                    self.failed = applier.failed
                    break
                for key, entry in applier.changes().items():
                    if entry is None:
                        self.entries.pop(key, None)
                    else:
                        self.entries[key] = entry
                self.meta = applier.meta
                cursor = max(cursor, seg.end)
        finally:
            reader.close()
        yield flush(max(cursor, chunk_start), final=True)
