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

import bisect
import gc
import itertools
import logging
import operator
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from inorder.errors import DataLossError, InorderError
from inorder.kafka.admin import client_config
from inorder.kafka.options import SourceOptions
from inorder.kafka.planning import LossEvent, LossKind
from inorder.records import KAFKA_ARROW_SCHEMA, TopicPartition
from inorder.spark.worker_heap import freeze_worker_heap

log = logging.getLogger(__name__)

#: Seconds without a record after which a read checks whether its partition was deleted.
GONE_CHECK_S = 2.0

#: Header key of the marker row that starts every planned range (``inorder.partitionMarkers``).
MARKER_HEADER = "inorder.range"


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

# librdkafka's limit for receive.message.max.bytes; see the module docstring for why.
_MAX_RECEIVE_BYTES = "2147483647"


def consumer_config(options: SourceOptions) -> dict[str, Any]:
    """Consumer settings: assign-only, no group commits, EOF events, bounded fetches."""
    conf: dict[str, Any] = {
        # Memory bound with a compliant broker: one fetch + the pre-fetch queue.
        "fetch.max.bytes": 16 * 1024 * 1024,
        "max.partition.fetch.bytes": 8 * 1024 * 1024,
        "queued.max.messages.kbytes": 32 * 1024,
        "receive.message.max.bytes": _MAX_RECEIVE_BYTES,
        "fetch.wait.max.ms": 100,
    }
    conf.update(client_config(options))
    conf.update(
        {
            "group.id": options.kafka.get(
                "group.id", f"{options.group_id_prefix}-{uuid.uuid4().hex[:12]}"
            ),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # an expired offset must surface, not be reset
            "isolation.level": options.isolation_level,
        }
    )
    return conf


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
            pa.array([-1] * n, pa.int32()),
            pa.array(
                [[{"key": MARKER_HEADER, "value": f"{s}-{e}".encode()}] for _, s, e in ranges],
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
) -> Generator[list[tuple[int, bytes | None, bytes | None, int | None, Any]], None, None]:
    """The records of ``tp`` in ``[start, end)`` as the engine's record tuples, in chunks.

    ``(offset, key, value, timestamp_us, headers)``, straight from the consumer's messages
    (no Arrow on the way); losses are handled as by :func:`read_range`.
    """
    from confluent_kafka import Message

    headers_of = Message.headers if options.include_headers else None
    # message_runs pauses the cyclic GC for the whole range, and here the caller's work (the
    # processor) runs inside that pause: a young-generation pass per chunk frees any cyclic
    # garbage it made, so memory does not grow with the range (one pass per chunk, not one
    # per 700 allocations).
    collect_young = gc.isenabled()
    for messages, offsets in message_runs(options, tp, start, end):
        n = len(messages)
        offset_list = range(offsets, offsets + n) if isinstance(offsets, int) else offsets
        # confluent-kafka timestamps: (0 not available | 1 create | 2 log append, ms)
        stamps = [ms * 1000 if kind else None for kind, ms in map(Message.timestamp, messages)]
        headers: Any = (
            itertools.repeat(None, n)
            if headers_of is None
            else [h or None for h in map(headers_of, messages)]
        )
        yield list(
            zip(
                offset_list,
                map(Message.key, messages),
                map(Message.value, messages),
                stamps,
                headers,
                strict=False,
            )
        )
        if collect_young:
            gc.collect(0)


def message_runs(
    options: SourceOptions, tp: TopicPartition, start: int, end: int
) -> Iterator[tuple[list[Any], list[int] | int]]:
    """The consumer's messages of ``[start, end)``, in offset order, a fetch at a time.

    Each item is ``(messages, offsets)``: ``offsets`` is the list of their offsets, or the
    first offset when they are contiguous.
    """
    from confluent_kafka import Consumer, KafkaError, KafkaException, Message
    from confluent_kafka import TopicPartition as CTP

    if start >= end:
        return
    try:
        consumer = Consumer(consumer_config(options))
    except KafkaException as exc:
        raise InorderError(f"kafka.*: {exc.args[0].str()}") from None
    # Each batch allocates tens of thousands of short-lived objects (messages, tuples) that
    # never form cycles; the cyclic GC scanning them cost ~30% of the read rate (measured).
    # Paused while this range is read, restored when the generator ends or is closed.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        consumer.assign([CTP(tp.topic, tp.partition, start)])
        expected = start
        timeout_s = options.poll_timeout_ms / 1000.0
        last_progress = time.monotonic()
        while expected < end:
            # Never ask for more than the range still holds: consume() returns only once it
            # has num_messages or the timeout passed, so asking for a full batch on the last
            # fetch of a range waited the whole timeout (0.5 s per task and micro-batch).
            # With gaps (transaction markers) fewer records exist; the partition-EOF event
            # usually completes the count, else the timeout ends the wait as before.
            want = max(1, min(options.batch_rows, end - expected))
            messages = consumer.consume(num_messages=want, timeout=0.5)
            done = False
            # (KafkaError.__eq__ raises on None: compare by identity.)
            errors = map(operator.is_not, map(Message.error, messages), itertools.repeat(None))
            if messages and not any(errors):
                # Fast path: only records (no EOF or error event) in this batch. Offsets
                # of one partition strictly increase, so first and last tell a contiguous run.
                first = int(messages[0].offset() or 0)
                last = int(messages[-1].offset() or 0)
                offsets: list[int] | int = first
                if last >= end or last - first + 1 != len(messages):
                    offsets = list(map(Message.offset, messages))  # type: ignore[arg-type]
                    if last >= end:
                        cut = bisect.bisect_left(offsets, end)
                        messages, offsets, done = messages[:cut], offsets[:cut], True
                        last = offsets[-1] if offsets else last
                if messages:
                    expected = last + 1
                    last_progress = time.monotonic()
                    yield messages, offsets
                if done:
                    break
                continue
            data = []
            for message in messages:
                error = message.error()
                if error is None:
                    offset = int(message.offset() or 0)
                    if offset >= end:
                        done = True
                        break
                    data.append(message)
                    expected = offset + 1
                    continue
                code = error.code()
                if code == KafkaError._PARTITION_EOF:
                    if int(message.offset() or 0) >= end:
                        done = True
                        break
                    continue
                if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    resume = _handle_out_of_range(consumer, options, tp, expected, end)
                    if resume is None:
                        done = True
                        break
                    expected = resume
                    break
                if code in (
                    KafkaError.UNKNOWN_TOPIC_OR_PART,
                    KafkaError._UNKNOWN_PARTITION,
                    KafkaError._UNKNOWN_TOPIC,
                ):
                    event = LossEvent(tp, LossKind.DELETED, expected, end)
                    if options.fail_on_data_loss:
                        raise DataLossError(event.message())
                    log.warning("skipping: %s", event.message())
                    done = True
                    break
                if error.fatal() or not error.retriable():
                    raise InorderError(
                        f"reading topic {tp.topic!r} partition {tp.partition} at offset "
                        f"{expected}: {error.str()}"
                    )
            if data:
                last_progress = time.monotonic()
                yield data, [int(m.offset() or 0) for m in data]
            if done:
                break
            if not messages:
                position = int(consumer.position([CTP(tp.topic, tp.partition)])[0].offset or -1)
                if position >= end:
                    break
                waited = time.monotonic() - last_progress
                if waited > GONE_CHECK_S and _partition_gone(consumer, tp, options):
                    # A topic deleted under the read: some brokers send no error for it, the
                    # poll would only time out (after pollTimeoutMs) without naming the loss.
                    event = LossEvent(tp, LossKind.DELETED, expected, end)
                    if options.fail_on_data_loss:
                        raise DataLossError(event.message())
                    log.warning("skipping: %s", event.message())
                    break
                if waited > timeout_s:
                    raise InorderError(
                        f"reading topic {tp.topic!r} partition {tp.partition}: no record "
                        f"between offsets {expected} and {end} arrived within "
                        f"{timeout_s:g} s (kafkaConsumer.pollTimeoutMs)"
                    )
    finally:
        consumer.close()
        if gc_was_enabled:
            gc.enable()


def _partition_gone(consumer: Any, tp: TopicPartition, options: SourceOptions) -> bool:
    """Whether the broker answers that ``tp`` no longer exists (not: cannot be asked)."""
    try:
        meta = consumer.list_topics(tp.topic, timeout=options.metadata_timeout_ms / 1000.0)
    except Exception:  # KafkaException: the broker is unreachable, which is not a deletion
        return False
    from confluent_kafka import KafkaError

    topic = meta.topics.get(tp.topic)
    if topic is None:
        return True
    if topic.error is not None:
        return bool(
            topic.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
        )
    return tp.partition not in topic.partitions


def _handle_out_of_range(
    consumer: Any, options: SourceOptions, tp: TopicPartition, expected: int, end: int
) -> int | None:
    """Offset ``expected`` is gone: fail, or seek to the first available one (skip mode)."""
    from confluent_kafka import TopicPartition as CTP

    low, high = consumer.get_watermark_offsets(
        CTP(tp.topic, tp.partition), timeout=options.metadata_timeout_ms / 1000.0, cached=False
    )
    if expected >= low:
        raise InorderError(
            f"reading topic {tp.topic!r} partition {tp.partition}: offset {expected} out of "
            f"range (log {low}..{high})"
        )
    event = LossEvent(tp, LossKind.EXPIRED, expected, low)
    if options.fail_on_data_loss:
        raise DataLossError(event.message())
    log.warning("skipping: %s", event.message())
    if low >= end:
        return None
    consumer.assign([CTP(tp.topic, tp.partition, low)])
    return int(low)
