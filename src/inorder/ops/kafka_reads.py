"""Kafka reads for the operations tools: one topic-partition, in offset order, in chunks.

Memory stays bounded by one chunk of records (the consumer's ``inorder.batchRows``, 10,000
by default) whatever the partition's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from inorder.kafka.admin import KafkaAdmin
from inorder.kafka.options import SourceOptions
from inorder.kafka.planning import Watermarks
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
) -> Iterator[list[RecordTuple]]:
    """Records of ``tp`` with offsets in ``[start, end)``, in offset order, chunk by chunk."""
    from inorder.kafka.consumer import read_range

    if start >= end:
        return
    batches = read_range(options, tp, start, end, markers=False)
    if getattr(options, "archive", ""):  # a tiered source: archive below its end, then Kafka
        from inorder.archive.tool_reads import read_tiered

        batches = read_tiered(options, tp, start, end)
    for batch in batches:
        if batch.num_rows:
            yield record_tuples(batch)


def _admin(options: SourceOptions) -> KafkaAdmin:
    """The metadata client: archive-aware when the options name an archive."""
    if getattr(options, "archive", ""):
        from inorder.archive.tiered_source import TieredAdmin, TieredOptions

        assert isinstance(options, TieredOptions)
        return TieredAdmin(options)
    return KafkaAdmin(options)


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
