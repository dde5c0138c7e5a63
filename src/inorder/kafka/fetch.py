"""Fetching planned ranges ``[start, end)`` of one or more topic-partitions with one consumer.

A task of the partition backend reads every range it was given (often several partitions
when partitions outnumber task slots). One consumer assigned all of them fetches them together
on librdkafka's threads: the next partition's records are already queued while the current
ones are applied, and a task pays one consumer's set-up (threads, connection, metadata: about
6 ms) instead of one per range. Each partition's records still come in offset order; runs of
different partitions interleave as the broker serves them, and each run is handed on with its
partition, so a caller keeps per-partition order without any ordering across partitions.

End of range: offsets are not contiguous (transaction markers and compaction consume
offsets), so the last offsets before ``end`` may never arrive as records. A partition's read
stops at its first record at or past ``end``, or when the consumer's position / the
partition-EOF event reaches ``end``: never waiting for an offset that does not exist. A
partition that is done is unassigned, so nothing more is fetched for it.
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
from dataclasses import dataclass
from typing import Any

from inorder.errors import DataLossError, InorderError
from inorder.kafka.admin import client_config
from inorder.kafka.options import SourceOptions
from inorder.kafka.planning import LossEvent, LossKind
from inorder.records import TopicPartition

log = logging.getLogger(__name__)

# librdkafka's limit for receive.message.max.bytes: some Kafka-protocol emulators (noida-db)
# ignore the fetch limits and answer a fetch with the rest of the partition (see
# inorder.kafka.consumer), and such a response must not fail with "Invalid response size".
_MAX_RECEIVE_BYTES = "2147483647"

#: Seconds without a record after which a read checks whether its partition was deleted.
GONE_CHECK_S = 2.0

#: ``(partition, messages, offsets)``: ``offsets`` is the list of the messages' offsets, or the
#: first offset when they are contiguous.
Run = tuple[TopicPartition, list[Any], list[int] | int]


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


@dataclass
class _Open:
    """A range still being read: the next offset expected and when a record last came."""

    tp: TopicPartition
    expected: int
    end: int
    last_progress: float
    #: Moved to the log start after expired offsets: read on with a new consumer.
    moved: bool = False
    #: Offsets of the range skipped as lost (``failOnDataLoss=false``): expired or deleted.
    lost: int = 0


def fetch_runs(
    options: SourceOptions,
    ranges: Sequence[tuple[TopicPartition, int, int]],
    lost: dict[TopicPartition, int] | None = None,
) -> Iterator[Run]:
    """The consumer's messages of every range, a run of one partition at a time.

    ``ranges`` name distinct partitions (a partition's next range is a later call).

    Expired offsets (below the log start) raise :class:`DataLossError` naming topic,
    partition, expected and available offsets, or are skipped with a warning when
    ``failOnDataLoss`` is false; a deleted topic likewise. Skipped offsets are added to
    ``lost`` per partition, so the run can say what its policy set aside.
    """
    from confluent_kafka import Consumer, KafkaException

    now = time.monotonic()
    reading = {
        (tp.topic, tp.partition): _Open(tp, start, end, now)
        for tp, start, end in ranges
        if start < end
    }
    if len(reading) != sum(1 for _, start, end in ranges if start < end):
        raise ValueError(f"fetch_runs reads one range per partition at a time, not {ranges}")
    if not reading:
        return
    opened = list(reading.values())
    # Each batch allocates tens of thousands of short-lived objects (messages, tuples) that
    # never form cycles; the cyclic GC scanning them cost ~30% of the read rate (measured).
    # Paused while the ranges are read, restored when the generator ends or is closed.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    consumer: Any = None
    try:
        while reading:
            try:
                consumer = Consumer(consumer_config(options))
            except KafkaException as exc:
                raise InorderError(f"kafka.*: {exc.args[0].str()}") from None
            if not (yield from _fetch(consumer, options, reading)):
                break
            # A partition moved to its log start (expired offsets skipped): a new consumer
            # for what is left, so nothing fetched before the move can reach the reader.
            consumer.close()
            consumer = None
    finally:
        if consumer is not None:
            consumer.close()
        if gc_was_enabled:
            gc.enable()
        if lost is not None:
            for skipped in opened:
                if skipped.lost:
                    lost[skipped.tp] = lost.get(skipped.tp, 0) + skipped.lost


def _fetch(
    consumer: Any, options: SourceOptions, reading: dict[tuple[str, int], _Open]
) -> Generator[Run, None, bool]:
    """Read with ``consumer`` until every range is done (``False``) or one moved (``True``)."""
    from confluent_kafka import TopicPartition as CTP

    consumer.assign([CTP(r.tp.topic, r.tp.partition, r.expected) for r in reading.values()])
    timeout_s = options.poll_timeout_ms / 1000.0
    while reading:
        # Never ask for more than the ranges still hold: consume() returns only once it has
        # num_messages or the timeout passed, so asking for a full batch on the last fetch
        # of a range waited the whole timeout (0.5 s per task and micro-batch).
        left = sum(r.end - r.expected for r in reading.values())
        want = max(1, min(options.batch_rows, left))
        messages = consumer.consume(num_messages=want, timeout=0.5)
        moved = False
        finished: list[Any] = []
        for key, run in _partition_runs(messages, single=len(reading) == 1):
            current = reading.get(key) if key is not None else None
            if current is None:
                if key is None or len(reading) == 1:
                    current = next(iter(reading.values()))  # a client-wide event
                else:
                    continue  # a partition already done: what was prefetched past its end
            if current.moved:
                continue  # what this consumer still had from before the move
            taken, done = _take(consumer, options, current, run)
            if taken is not None:
                yield taken
            moved = moved or current.moved
            if done:
                _finish(consumer, reading, current, finished)
        if finished and reading:
            # One call for every range this fetch completed: with many small ranges (many
            # topics, few records each) a call per range was a sizeable share of the read.
            consumer.incremental_unassign(finished)
        if moved:
            for r in reading.values():
                r.moved = False
            return True
        if not messages:
            _check_stalled(consumer, options, reading, timeout_s)
    return False


def _partition_runs(
    messages: list[Any], single: bool
) -> Iterator[tuple[tuple[str, int] | None, list[Any]]]:
    """Split a consume() result into runs of one partition (key ``None``: client-wide)."""
    if not messages:
        return
    if single:  # one partition assigned: every record is its own; events carry no other
        yield None, messages
        return
    from confluent_kafka import Message

    keys: list[Any] = list(
        zip(map(Message.topic, messages), map(Message.partition, messages), strict=True)
    )
    first = keys[0]
    if keys.count(first) == len(keys):
        yield (first if first[0] is not None else None), messages
        return
    start = 0
    for key, group in itertools.groupby(keys):
        n = sum(1 for _ in group)
        yield (key if key[0] is not None else None), messages[start : start + n]
        start += n


def _take(
    consumer: Any, options: SourceOptions, current: _Open, messages: list[Any]
) -> tuple[Run | None, bool]:
    """The records of one run that fall in ``current``'s range, and whether it is done."""
    from confluent_kafka import KafkaError, Message

    tp, end = current.tp, current.end
    # (KafkaError.__eq__ raises on None: compare by identity.)
    errors = map(operator.is_not, map(Message.error, messages), itertools.repeat(None))
    if not any(errors):
        # Fast path: only records (no EOF or error event) in this run. Offsets of one
        # partition strictly increase, so first and last tell a contiguous run.
        first = int(messages[0].offset() or 0)
        last = int(messages[-1].offset() or 0)
        offsets: list[int] | int = first
        done = False
        if last >= end or last - first + 1 != len(messages):
            offsets = list(map(Message.offset, messages))  # type: ignore[arg-type]
            if last >= end:
                cut = bisect.bisect_left(offsets, end)
                messages, offsets, done = messages[:cut], offsets[:cut], True
                last = offsets[-1] if offsets else last
        if not messages:
            return None, done
        current.expected = last + 1
        current.last_progress = time.monotonic()
        return (tp, messages, offsets), done or current.expected >= end
    data = []
    done = False
    for message in messages:
        error = message.error()
        if error is None:
            offset = int(message.offset() or 0)
            if offset >= end:
                done = True
                break
            data.append(message)
            current.expected = offset + 1
            continue
        code = error.code()
        if code == KafkaError._PARTITION_EOF:
            if int(message.offset() or 0) >= end:
                done = True
                break
            continue
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            resume = _handle_out_of_range(consumer, options, tp, current.expected, end)
            current.lost += (end if resume is None else resume) - current.expected
            if resume is None:
                done = True
                break
            current.expected = resume
            current.moved = True
            break
        if code in (
            KafkaError.UNKNOWN_TOPIC_OR_PART,
            KafkaError._UNKNOWN_PARTITION,
            KafkaError._UNKNOWN_TOPIC,
        ):
            _deleted(current, options)
            done = True
            break
        if error.fatal() or not error.retriable():
            raise InorderError(
                f"reading topic {tp.topic!r} partition {tp.partition} at offset "
                f"{current.expected}: {error.str()}"
            )
    if not data:
        return None, done
    current.last_progress = time.monotonic()
    return (tp, data, [int(m.offset() or 0) for m in data]), done or current.expected >= end


def _check_stalled(
    consumer: Any, options: SourceOptions, reading: dict[tuple[str, int], _Open], timeout_s: float
) -> None:
    """After an empty fetch: finish ranges whose position passed their end; name a stall."""
    from confluent_kafka import TopicPartition as CTP

    positions = consumer.position([CTP(r.tp.topic, r.tp.partition) for r in reading.values()])
    now = time.monotonic()
    for position in positions:
        key = (position.topic, position.partition)
        current = reading.get(key)
        if current is None:
            continue
        if int(position.offset if position.offset is not None else -1) >= current.end:
            _finish(consumer, reading, current)
            continue
        tp, waited = current.tp, now - current.last_progress
        if waited > GONE_CHECK_S and _partition_gone(consumer, tp, options):
            # A topic deleted under the read: some brokers send no error for it, the poll
            # would only time out (after pollTimeoutMs) without naming the loss.
            _deleted(current, options)
            _finish(consumer, reading, current)
            continue
        if waited > timeout_s:
            raise InorderError(
                f"reading topic {tp.topic!r} partition {tp.partition}: no record "
                f"between offsets {current.expected} and {current.end} arrived within "
                f"{timeout_s:g} s (kafkaConsumer.pollTimeoutMs)"
            )


def _finish(
    consumer: Any,
    reading: dict[tuple[str, int], _Open],
    current: _Open,
    unassign_later: list[Any] | None = None,
) -> None:
    """``current``'s range is read: drop it, and stop fetching its partition (at once, or
    by the caller with the others in ``unassign_later``)."""
    from confluent_kafka import TopicPartition as CTP

    del reading[(current.tp.topic, current.tp.partition)]
    done = CTP(current.tp.topic, current.tp.partition)
    if unassign_later is not None:
        unassign_later.append(done)
    elif reading:
        consumer.incremental_unassign([done])


def _deleted(current: _Open, options: SourceOptions) -> None:
    """The partition of ``current`` was deleted: raise the loss, or warn and skip it."""
    event = LossEvent(current.tp, LossKind.DELETED, current.expected, current.end)
    if options.fail_on_data_loss:
        raise DataLossError(event.message())
    log.warning("skipping: %s", event.message())
    current.lost += max(current.end - current.expected, 0)


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
    return int(low)
