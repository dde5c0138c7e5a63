"""Kafka reads for the operations tools: one topic-partition, in offset order, in chunks.

Memory stays bounded by one chunk of records (the consumer's ``inorder.batchRows``, 10,000
by default) whatever the partition's size. The options come from the pipeline's source
(:meth:`~inorder.kafka.source_protocol.Source.read_options`); a tiered source's read through
its archive by themselves (:func:`~inorder.kafka.source_protocol.range_reader`), so these
tools need nothing of ``archive/``.
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Generator, Iterator
from typing import Any

import pyarrow as pa

from inorder.kafka.admin import KafkaAdmin
from inorder.kafka.options import SourceOptions
from inorder.kafka.planning import Watermarks
from inorder.kafka.source_protocol import range_reader
from inorder.records import RecordTuple, TopicPartition


def record_tuples(batch: pa.RecordBatch) -> list[RecordTuple]:
    """The applier's ``(offset, key, value, timestamp_us, headers)`` tuples of a batch."""
    n = batch.num_rows
    ts_col = batch.column("timestamp")
    ts: list[Any] = [None] * n if ts_col.null_count == n else ts_col.cast(pa.int64()).to_pylist()
    headers_col = batch.column("headers")
    headers: list[Any] = [None] * n if headers_col.null_count == n else headers_col.to_pylist()
    return list(
        zip(
            batch.column("offset").to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            ts,
            headers,
            strict=True,
        )
    )


def read_chunks(
    options: SourceOptions, tp: TopicPartition, start: int, end: int
) -> Generator[list[RecordTuple], None, None]:
    """Records of ``tp`` with offsets in ``[start, end)``, in offset order, chunk by chunk."""
    if start >= end:
        return
    for batch in range_reader(options).read_records(tp, start, end):
        if batch.num_rows:
            yield record_tuples(batch)


def _admin(options: SourceOptions) -> KafkaAdmin:
    """The metadata client: archive-aware when the options read through an archive."""
    return range_reader(options).admin()


def partitions(options: SourceOptions) -> list[TopicPartition]:
    """The topic-partitions the pipeline's subscription covers now."""
    return _admin(options).discover()


def watermarks(
    options: SourceOptions, tps: list[TopicPartition]
) -> dict[TopicPartition, Watermarks]:
    """Log-start and end offsets of ``tps`` (partitions the broker does not know are left out)."""
    found, _ = _admin(options).watermarks(tps)
    return found


def offsets_for_time(
    options: SourceOptions, tps: list[TopicPartition], epoch_ms: int
) -> dict[TopicPartition, int | None]:
    """Per partition, the first offset whose timestamp is at or after ``epoch_ms``."""
    return _admin(options).offsets_for_times(dict.fromkeys(tps, epoch_ms))


class SegmentedRead:
    """One read of ``tp`` over ``[start, end)``, handed out a segment at a time.

    A recomputation applies a partition batch by batch; a new consumer per batch would make
    the broker send (and the client decode) everything from that batch's start again, and
    a broker that ignores the fetch limits answers each of those fetches with the rest of
    the partition. One consumer reads the whole range once; :meth:`upto` cuts its chunks at
    each batch's end.
    """

    def __init__(self, options: SourceOptions, tp: TopicPartition, start: int, end: int) -> None:
        self._chunks = read_chunks(options, tp, start, end)
        self._held: list[RecordTuple] = []
        # The read pauses the cyclic GC while it lasts (see inorder.kafka.fetch), now a whole
        # partition instead of one batch: a young-generation pass per chunk frees the cyclic
        # garbage the caller's work makes meanwhile, so memory does not grow with the range.
        self._collect = gc.isenabled()

    def upto(self, start: int, end: int) -> Iterator[list[RecordTuple]]:
        """The records with ``start <= offset < end`` not handed out yet, in chunks.

        Records below ``start`` (a gap between two segments) are dropped; the first record
        at or past ``end`` is kept for the next call.
        """
        while True:
            chunk: list[RecordTuple] | None = self._held
            if not chunk:
                chunk = next(self._chunks, None)
                if chunk is None:
                    return
                if self._collect:
                    gc.collect(0)
            self._held = []
            if chunk[0][0] < start:
                chunk = [r for r in chunk if r[0] >= start]
                if not chunk:
                    continue
            if chunk[-1][0] < end:
                yield chunk
                continue
            cut = bisect.bisect_left(chunk, end, key=_offset)
            self._held = chunk[cut:]
            if cut:
                yield chunk[:cut]
            return

    def close(self) -> None:
        """Stop the read (closes its consumer)."""
        self._chunks.close()


def _offset(record: RecordTuple) -> int:
    return record[0]
