"""Reading one topic-partition range ``[start, end)`` in offset order, as Arrow record batches.

Runs inside a Spark task (on an executor). Memory is bounded by the consumer's fetch and
queue settings plus one output batch (``batch_rows`` records), whatever the backlog.
Caveat: some Kafka-protocol emulators (noida-db) ignore ``fetch.max.bytes`` and
``max.partition.fetch.bytes`` and answer a fetch with the rest of the partition, so the fetch
response itself can be as large as the backlog; ``receive.message.max.bytes`` is raised so such
a response is accepted instead of failing with "Invalid response size". Real Kafka brokers
honour the fetch limits.

Isolation: ``read_committed`` by default. Records of aborted transactions are never
delivered, and the planned end offsets are last-stable offsets, so a range never waits on an
open transaction. Exactly-once outputs must not see records a producer rolled back.

End of range: offsets are not contiguous (transaction markers and compaction consume
offsets), so the last offsets before ``end`` may never arrive as records. Reading stops at the
first record at or past ``end``, or when the consumer's position / the partition-EOF event
reaches ``end``: never waiting for an offset that does not exist.
"""

from __future__ import annotations

import gc
import itertools
import logging
import operator
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.kafka.fetch import fetch_runs
from inorder.kafka.markers import MARKER_HEADER, MARKER_TIMESTAMP_TYPE, encode_range
from inorder.kafka.options import SourceOptions
from inorder.records import KAFKA_ARROW_SCHEMA, RecordTuple, TopicPartition
from inorder.spark.worker_heap import freeze_worker_heap

log = logging.getLogger(__name__)

#: Seconds without a record after which a read checks whether its partition was deleted.
GONE_CHECK_S = 2.0


def _spark_compatible(schema: pa.Schema) -> pa.Schema:
    """``schema`` as Spark derives it from the DDL: every field nullable, list items "element".

    Spark's Python data source runner compares the yielded batches' schema with
    ``Schema.equals``, so the non-null origin columns and pyarrow's default list item name
    ("item") of :data:`~inorder.records.KAFKA_ARROW_SCHEMA` would be rejected.
    """

    def fix(t: pa.DataType) -> pa.DataType:
        if pa.types.is_list(t):
            return pa.list_(pa.field("element", fix(t.value_type), nullable=True))
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, fix(f.type), nullable=True) for f in t])
        return t

    return pa.schema([pa.field(f.name, fix(f.type), nullable=True) for f in schema])


#: What ``read`` yields: the columns and types of :data:`~inorder.records.KAFKA_ARROW_SCHEMA`
#: in the exact form Spark checks (see :func:`_spark_compatible`).
SOURCE_ARROW_SCHEMA = _spark_compatible(KAFKA_ARROW_SCHEMA)

_HEADERS_TYPE = SOURCE_ARROW_SCHEMA.field("headers").type
_TS_TYPE = SOURCE_ARROW_SCHEMA.field("timestamp").type

_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


def marker_batch(tp: TopicPartition, start: int, end: int) -> pa.RecordBatch:
    """The one-row batch announcing a planned range (see :mod:`inorder.kafka.markers`)."""
    return markers_batch([(tp, start, end)])


def markers_batch(ranges: Sequence[tuple[TopicPartition, int, int]]) -> pa.RecordBatch:
    """One marker row per planned range ``(tp, start, end)``, in the order given."""
    n = len(ranges)
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(n, pa.binary()),
            pa.nulls(n, pa.binary()),
            pa.array([tp.topic for tp, _, _ in ranges], pa.string()),
            pa.array([tp.partition for tp, _, _ in ranges], pa.int32()),
            pa.array([start for _, start, _ in ranges], pa.int64()),
            pa.nulls(n, _TS_TYPE),
            pa.array([MARKER_TIMESTAMP_TYPE] * n, pa.int32()),
            pa.array(
                [[{"key": MARKER_HEADER, "value": encode_range(s, e)}] for _, s, e in ranges],
                _HEADERS_TYPE,
            ),
        ],
        schema=SOURCE_ARROW_SCHEMA,
    )


def _offsets_array(offsets: list[int] | int, n: int) -> pa.Array:
    """The offset column: from a list, or ``n`` consecutive offsets from a first one."""
    if isinstance(offsets, int):
        # A contiguous run (the common case): no per-record Python int list at all.
        return pa.array(np.arange(offsets, offsets + n, dtype=np.int64))
    return pa.array(offsets, pa.int64())


def _to_batch(
    tp: TopicPartition, messages: list[Any], offsets: list[int] | int, include_headers: bool
) -> pa.RecordBatch:
    """Arrow columns of ``messages`` (``offsets``: theirs, or the first of a contiguous run).

    Hot path: attribute getters are mapped in C (``map(Message.key, ...)``), columns are
    built in Arrow; no per-record Python bytecode.
    """
    from confluent_kafka import Message

    n = len(messages)
    stamps = list(map(Message.timestamp, messages))
    ts_types = list(map(_FIRST, stamps))
    ts_ms_arr = pa.array(list(map(_SECOND, stamps)), pa.int64())
    # confluent-kafka: 0 not available, 1 create time, 2 log-append time;
    # Spark's connector: -1, 0 and 1.
    if ts_types.count(1) == n:  # all CreateTime: one constant column
        ts_type = pa.nulls(n, pa.int32()).fill_null(0)
    else:
        ts_type_arr = pa.array(ts_types, pa.int32())
        if 0 in ts_types:  # "not available": null timestamp
            ts_ms_arr = pc.if_else(pc.equal(ts_type_arr, 0), pa.scalar(None, pa.int64()), ts_ms_arr)
        ts_type = pc.subtract(ts_type_arr, pa.scalar(1, pa.int32()))
    ts = pc.multiply(ts_ms_arr, 1000).cast(_TS_TYPE)
    if include_headers:
        headers = pa.array(
            [
                [{"key": k, "value": v} for k, v in h] if (h := m.headers()) else []
                for m in messages
            ],
            _HEADERS_TYPE,
        )
    else:
        headers = pa.nulls(n, _HEADERS_TYPE)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(list(map(Message.key, messages)), pa.binary()),
            pa.array(list(map(Message.value, messages)), pa.binary()),
            pa.DictionaryArray.from_arrays(
                pa.nulls(n, pa.int32()).fill_null(0), pa.array([tp.topic], pa.string())
            ).cast(pa.string()),
            pa.nulls(n, pa.int32()).fill_null(tp.partition),
            _offsets_array(offsets, n),
            ts,
            ts_type,
            headers,
        ],
        schema=SOURCE_ARROW_SCHEMA,
    )


def read_range(
    options: SourceOptions,
    tp: TopicPartition,
    start: int,
    end: int,
    *,
    markers: bool | None = None,
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``tp`` with offsets in ``[start, end)``, in offset order.

    With markers (default: ``options.partition_markers``) the first batch is the marker row.
    Expired offsets (below the log start) raise :class:`DataLossError` naming topic,
    partition, expected and available offsets, or are skipped with a warning when
    ``failOnDataLoss`` is false. A deleted topic is handled the same way.
    """
    freeze_worker_heap()
    if markers if markers is not None else options.partition_markers:
        yield marker_batch(tp, start, end)
    for messages, offsets in message_runs(options, tp, start, end):
        yield _to_batch(tp, messages, offsets, options.include_headers)


def read_records(
    options: SourceOptions, tp: TopicPartition, start: int, end: int
) -> Generator[list[RecordTuple], None, None]:
    """The records of ``tp`` in ``[start, end)`` as the engine's record tuples, in chunks.

    ``(offset, key, value, timestamp_us, headers)``, straight from the consumer's messages
    (no Arrow on the way); losses are handled as by :func:`read_range`.
    """
    for _, chunk in read_ranges_records(options, [(tp, start, end)]):
        yield chunk


def read_ranges_records(
    options: SourceOptions,
    ranges: Sequence[tuple[TopicPartition, int, int]],
    lost: dict[TopicPartition, int] | None = None,
) -> Generator[tuple[TopicPartition, list[RecordTuple]], None, None]:
    """The records of every range, one consumer for all, as ``(partition, chunk)``.

    Each partition's chunks come in offset order; chunks of different partitions interleave
    (:func:`inorder.kafka.fetch.fetch_runs`, which adds offsets skipped as lost to ``lost``).
    """
    from confluent_kafka import Message

    headers_of = Message.headers if options.include_headers else None
    # fetch_runs pauses the cyclic GC for the whole read, and here the caller's work (the
    # processor) runs inside that pause: a young-generation pass per chunk frees any cyclic
    # garbage it made, so memory does not grow with the range (one pass per chunk, not one
    # per 700 allocations).
    collect_young = gc.isenabled()
    for tp, messages, offsets in fetch_runs(options, ranges, lost):
        n = len(messages)
        offset_list = range(offsets, offsets + n) if isinstance(offsets, int) else offsets
        # confluent-kafka timestamps: (0 not available | 1 create | 2 log append, ms)
        stamps = [ms * 1000 if kind else None for kind, ms in map(Message.timestamp, messages)]
        headers: Any = (
            itertools.repeat(None, n)
            if headers_of is None
            else [h or None for h in map(headers_of, messages)]
        )
        yield (
            tp,
            list(
                zip(
                    offset_list,
                    map(Message.key, messages),
                    map(Message.value, messages),
                    stamps,
                    headers,
                    strict=False,
                )
            ),
        )
        if collect_young:
            gc.collect(0)


def message_runs(
    options: SourceOptions, tp: TopicPartition, start: int, end: int
) -> Iterator[tuple[list[Any], list[int] | int]]:
    """The consumer's messages of ``[start, end)``, in offset order, a fetch at a time.

    Each item is ``(messages, offsets)``: ``offsets`` is the list of their offsets, or the
    first offset when they are contiguous (:func:`inorder.kafka.fetch.fetch_runs`).
    """
    for _, messages, offsets in fetch_runs(options, [(tp, start, end)]):
        yield messages, offsets
